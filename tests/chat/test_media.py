"""Media is stored once by content hash."""

import base64

import pytest

from chat.media import MediaError, decode_base64, media_store
from chat.models import Media

pytestmark = pytest.mark.django_db

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_same_content_is_stored_once_with_a_hash_named_file(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    a = media_store(data=PNG, kind="image")
    b = media_store(data=decode_base64(base64.b64encode(PNG).decode()), kind="image")
    assert a.pk == b.pk and Media.objects.count() == 1
    assert a.mime == "image/png" and a.file.name.endswith(f"{a.sha256}.png")
    assert (tmp_path / a.file.name).read_bytes() == PNG


def test_bad_payloads_are_refused(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    with pytest.raises(MediaError):
        decode_base64("!!!not base64!!!")
    with pytest.raises(MediaError):
        media_store(data=b"", kind="image")
    with pytest.raises(MediaError):
        media_store(data=PNG, kind="video")
    assert not Media.objects.exists()
