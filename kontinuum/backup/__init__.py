"""etcd backup and disaster recovery (DESIGN §10): the snapshot checks, the encrypted file
format, file naming and retention, where files go (a folder or an S3 bucket), the zone's
os:etcd:backup credential, and the three operations (take a backup, verify one restores in a
scratch etcd, restore a zone)."""
