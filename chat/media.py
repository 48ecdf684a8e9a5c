"""Media storage: images, emojis and voice clips stored once by content hash in the data dir."""

from __future__ import annotations

import base64
import binascii
import hashlib
import mimetypes

from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction

from chat.models import Media, MediaKind

_MAGIC = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"RIFF", "image/webp"),  # checked further below
    (b"#!AMR", "audio/amr"),
    (b"\x02#!SILK", "audio/silk"),
    (b"OggS", "audio/ogg"),
    (b"ID3", "audio/mpeg"),
]


class MediaError(ValueError):
    """The media payload is not usable (bad base64, empty, unknown kind)."""


def sniff_mime(data: bytes) -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            if mime == "image/webp" and data[8:12] != b"WEBP":
                continue
            return mime
    return "application/octet-stream"


def decode_base64(text: str) -> bytes:
    """Bare base64 as adapters send it; a `data:…;base64,` prefix is tolerated."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        data = base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"not valid base64: {exc}") from None
    if not data:
        raise MediaError("empty media payload")
    return data


def media_store(*, data: bytes, kind: str, description: str = "") -> Media:
    """Store bytes once per (hash, kind); a second store of the same content returns the same row."""
    if kind not in MediaKind.values:
        raise MediaError(f"unknown media kind {kind!r}")
    if not data:
        raise MediaError("empty media payload")
    digest = hashlib.sha256(data).hexdigest()
    existing = Media.objects.filter(sha256=digest, kind=kind).first()
    if existing is not None:
        return existing
    mime = sniff_mime(data)
    ext = mimetypes.guess_extension(mime) or ".bin"
    media = Media(sha256=digest, kind=kind, mime=mime, size=len(data), description=description)
    try:
        with transaction.atomic():
            # The file name is the hash: writing the same content twice leaves one identical file.
            media.file.save(f"{digest}{ext}", ContentFile(data), save=False)
            media.save()
    except IntegrityError:  # stored concurrently by another request
        return Media.objects.get(sha256=digest, kind=kind)
    return media
