"""Boot image signatures (yolo_common/signing.py)."""

import base64
import hashlib

import pytest

from yolo_common import signing

DIGEST = hashlib.sha512(b'a boot image').hexdigest()


def test_a_signature_verifies_only_for_its_image_its_data_and_its_key():
    worker = signing.Signer.generate()
    signature = worker.sign('image-1', 'sha512', DIGEST)
    verifier = signing.Verifier([signing.Signer.generate().public_key, worker.public_key])
    assert verifier.verify(signature, 'image-1', 'sha512', DIGEST)
    assert verifier.verify(signature, 'image-1', 'sha512', DIGEST.upper())
    assert not verifier.verify(signature, 'image-2', 'sha512', DIGEST)
    assert not verifier.verify(signature, 'image-1', 'sha512', hashlib.sha512(b'x').hexdigest())
    assert not verifier.verify(signature, 'image-1', 'sha384', DIGEST)
    assert not signing.Verifier([signing.Signer.generate().public_key]).verify(
        signature, 'image-1', 'sha512', DIGEST)
    for garbage in (None, '', 'not base64!', 'AAAA', signature[:-4] + 'AAA='):
        assert not verifier.verify(garbage, 'image-1', 'sha512', DIGEST)


def test_weak_digests_are_never_signed_or_accepted():
    worker = signing.Signer.generate()
    with pytest.raises(signing.SigningError):
        worker.sign('image-1', 'md5', hashlib.md5(b'x').hexdigest())
    # A signature over an MD5 (made without this module) does not verify either.
    message = b'\n'.join((signing.LABEL, b'image-1', b'md5',
                         hashlib.md5(b'x').hexdigest().encode()))
    forged = base64.b64encode(worker._key.sign(message)).decode()
    assert not worker.verifier().verify(forged, 'image-1', 'md5', hashlib.md5(b'x').hexdigest())


def test_keys_on_disk(tmp_path):
    path = tmp_path / 'key'
    made = signing.Signer.create(str(path))
    assert path.stat().st_mode & 0o777 == 0o600
    assert signing.Signer.create(str(path)).public_key == made.public_key
    data = tmp_path / 'data'
    data.write_bytes(b'a boot image')
    assert signing.file_digest(data, 'sha512') == DIGEST
    path.chmod(0o640)
    with pytest.raises(signing.SigningError, match='may be read by others'):
        signing.Signer.from_file(str(path))
    path.chmod(0o600)
    path.write_text('not a key')
    with pytest.raises(ValueError):
        signing.Signer.from_file(str(path))
    with pytest.raises(signing.SigningError):
        signing.Verifier(['not a key'])
    with pytest.raises(signing.SigningError):
        signing.Verifier([])
