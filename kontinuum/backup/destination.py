"""Where a zone's backups go, from `zones[].backup.destination`: a folder, or an S3-compatible
bucket given as a URL with the parameters the state backend takes (gocloud.dev's s3blob):

    s3://<bucket>[/<prefix>]?endpoint=https://s3.example.com&use_path_style=true&region=eu-central-1

`endpoint` (a custom store), `use_path_style=true` or its older spelling `s3ForcePathStyle=true`
(stores without virtual-host buckets), `region`, `profile` (a profile of the AWS shared config).
Credentials come from the standard AWS environment variables or profile, never from the URL or
the state. Pure parsing here; store.py talks to the folder or the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from kontinuum.backup.errors import BackupError

PARAMETERS = ("endpoint", "use_path_style", "s3ForcePathStyle", "region", "profile")
_TRUE, _FALSE = ("true", "1"), ("false", "0")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str = ""  # no leading or trailing slash
    endpoint: str | None = None
    path_style: bool = False
    region: str | None = None
    profile: str | None = None

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def url(self, key: str = "") -> str:
        """`s3://bucket/key` plus the parameters needed to reach it again (no credentials)."""
        query = "&".join(f"{k}={v}" for k, v in (("endpoint", self.endpoint), ("region", self.region),
                                                  ("use_path_style", "true" if self.path_style else None),
                                                  ("profile", self.profile)) if v)
        return f"s3://{self.bucket}/{key}" + (f"?{query}" if query else "")


def is_s3(text: str) -> bool:
    return str(text).startswith("s3://")


def parse_s3(text: str, where: str = "backup.destination") -> S3Location:
    """The bucket, prefix and parameters of an `s3://` URL; refuses what would silently go elsewhere."""
    parts = urlsplit(text)
    if parts.scheme != "s3" or not parts.netloc:
        raise BackupError(f"{where}: {text!r} is not an s3://<bucket>[/<prefix>] URL")
    if "@" in parts.netloc or ":" in parts.netloc:
        raise BackupError(f"{where}: the bucket of {parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]} may hold no "
                          "credentials or port; credentials come from the AWS environment or profile, the store's "
                          "address from `endpoint=`")
    params: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in PARAMETERS:
            raise BackupError(f"{where}: unknown parameter {name!r} in the S3 URL (known: {', '.join(PARAMETERS)})")
        params[name] = value
    style = params.get("use_path_style", params.get("s3ForcePathStyle", "false")).lower()
    if style not in _TRUE + _FALSE:
        raise BackupError(f"{where}: use_path_style/s3ForcePathStyle must be true or false, got {style!r}")
    endpoint = params.get("endpoint") or None
    if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
        raise BackupError(f"{where}: endpoint {endpoint!r} must be an http:// or https:// URL")
    return S3Location(bucket=parts.netloc, prefix=parts.path.strip("/"), endpoint=endpoint,
                      path_style=style in _TRUE, region=params.get("region") or None,
                      profile=params.get("profile") or None)


def problem(text: object) -> str | None:
    """What is wrong with a destination value (the stack-config validator's check), or None."""
    if not isinstance(text, str) or not text.strip():
        return "must be a folder or an s3:// URL"
    if is_s3(text):
        try:
            parse_s3(text)
        except BackupError as e:
            return str(e).split(": ", 1)[1]
    elif "://" in text:
        return f"{text.split('://')[0]}:// is not supported: give a folder or an s3:// URL"
    return None


def resolve(text: str, base: Path) -> str:
    """A folder relative to the project folder made absolute; an S3 URL as it is."""
    return text if is_s3(text) else str(Path(base) / text)
