"""One zone's backup files in a folder or in an S3-compatible bucket, behind one small interface
(take, prune, verify, restore and status use only this): list the names, stage a file locally and
commit it (a folder: rename the `.part` into place; a bucket: upload, then drop the local copy),
fetch one for reading, small JSON records beside a file, delete.

Layout in both: `<destination>/<stack>/<region>-<zone>/<file>` (a bucket: under its prefix).
Every S3 call is bounded (connect and read timeouts, a few retries); credentials come from
boto3's standard chain (AWS_* environment variables, AWS_PROFILE or the URL's `profile`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from kontinuum.backup import destination as dest
from kontinuum.backup.zone import BackupError

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
ATTEMPTS = 3


class FolderStore:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir()) if self.folder.is_dir() else []

    def describe(self, name: str) -> str:
        return str(self.folder / name)

    def stage(self, name: str) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.folder / f"{name}.part"

    def commit(self, staged: Path, name: str) -> str:
        os.replace(staged, self.folder / name)
        return self.describe(name)

    def discard(self, staged: Path) -> None:
        staged.unlink(missing_ok=True)

    @contextmanager
    def local(self, name: str) -> Iterator[Path]:
        yield self.folder / name

    def put_json(self, name: str, doc: dict) -> str:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = self.folder / f"{name}.part"
        part.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.replace(part, self.folder / name)
        return self.describe(name)

    def get_json(self, name: str) -> dict | None:
        try:
            return json.loads((self.folder / name).read_text())
        except (OSError, ValueError):
            return None

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)


class S3Store:
    def __init__(self, location: dest.S3Location, stack: str, cluster: str) -> None:
        self.location, self.where = location, location.key(stack, cluster)
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
                            retries={"max_attempts": ATTEMPTS, "mode": "standard"},
                            s3={"addressing_style": "path" if self.location.path_style else "auto"})
            session = boto3.session.Session(profile_name=self.location.profile)
            self._client = session.client("s3", endpoint_url=self.location.endpoint,
                                          region_name=self.location.region, config=config)
        return self._client

    def _key(self, name: str) -> str:
        return f"{self.where}/{name}"

    def describe(self, name: str) -> str:
        return self.location.url(self._key(name))

    def _call(self, what: str, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return fn(*args, **kwargs)
        except NoCredentialsError:
            raise BackupError(f"{what} s3://{self.location.bucket}: no S3 credentials; set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE / the URL's profile=)") from None
        except ClientError as e:
            err = e.response.get("Error") or {}
            raise BackupError(f"{what} s3://{self.location.bucket}/{self.where}: the store answered "
                              f"{err.get('Code', '?')} ({err.get('Message') or 'no message'}); check the bucket, "
                              "the endpoint and that the credentials may read and write it") from None
        except BotoCoreError as e:
            raise BackupError(f"{what} s3://{self.location.bucket} at {self.location.endpoint or 'AWS'}: {e}; "
                              "check the endpoint and the network, then retry") from None

    def names(self) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")

        def listing() -> list[str]:
            return [obj["Key"].rsplit("/", 1)[-1] for page in paginator.paginate(
                Bucket=self.location.bucket, Prefix=f"{self.where}/") for obj in page.get("Contents") or []]

        return sorted(self._call("listing", listing))

    def stage(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix="kontinuum-backup-")) / name

    def commit(self, staged: Path, name: str) -> str:
        try:
            self._call("uploading to", self.client.upload_file, str(staged), self.location.bucket, self._key(name))
        finally:
            self.discard(staged)
        return self.describe(name)

    def discard(self, staged: Path) -> None:
        shutil.rmtree(staged.parent, ignore_errors=True)

    @contextmanager
    def local(self, name: str) -> Iterator[Path]:
        """A private local copy of the (sealed) file, removed afterwards."""
        staged = self.stage(name)
        try:
            self._call("downloading from", self.client.download_file, self.location.bucket, self._key(name),
                       str(staged))
            yield staged
        finally:
            self.discard(staged)

    def put_json(self, name: str, doc: dict) -> str:
        body = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        self._call("writing to", self.client.put_object, Bucket=self.location.bucket, Key=self._key(name), Body=body,
                   ContentType="application/json")
        return self.describe(name)

    def get_json(self, name: str) -> dict | None:
        from botocore.exceptions import ClientError

        def read() -> bytes | None:
            try:
                return self.client.get_object(Bucket=self.location.bucket, Key=self._key(name))["Body"].read()
            except ClientError as e:
                if (e.response.get("Error") or {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise

        body = self._call("reading", read)
        try:
            return json.loads(body) if body is not None else None
        except ValueError:
            return None

    def delete(self, name: str) -> None:
        self._call("deleting in", self.client.delete_object, Bucket=self.location.bucket, Key=self._key(name))


def for_zone(destination: str | Path, stack: str, cluster: str):
    """The store of one zone's backups under `destination` (a folder or an s3:// URL)."""
    stack = stack.rsplit("/", 1)[-1]
    if dest.is_s3(str(destination)):
        return S3Store(dest.parse_s3(str(destination)), stack, cluster)
    return FolderStore(Path(destination) / stack / cluster)


def for_file(text: str):
    """(store, name) of one backup given as a path or a full `s3://bucket/key?...` URL."""
    if dest.is_s3(text):
        loc = dest.parse_s3(text, "backup file")
        if "/" not in loc.prefix:
            raise BackupError(f"backup file {text}: give the whole object key, s3://<bucket>/<key>?endpoint=…")
        where, name = loc.prefix.rsplit("/", 1)
        store = S3Store(loc, "", "")
        store.where = where
        return store, name
    path = Path(text).resolve()
    return FolderStore(path.parent), path.name
