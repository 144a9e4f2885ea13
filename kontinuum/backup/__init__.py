"""etcd backup and disaster recovery (DESIGN §10): the snapshot checks, the encrypted file
format, file naming and retention, and the two operations (take a backup, restore a zone)."""
