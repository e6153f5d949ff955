"""Boot image signatures: only what the worker built is ever served before a download.

A boot image's bytes reach a guest before the image's download is verified (docs/first-boot.md),
so a compute host must know that the worker built it, not whoever can upload an image in the
worker's project (Nova's service user, whose password every compute host holds). The worker
signs each boot image it publishes with an Ed25519 key only it holds (``[yolo_worker]
signing_key_file``); compute hosts hold the public keys (``[yolo] boot_image_signing_keys``) and
check the signature over the bytes they downloaded before using any of them.

What is signed binds the boot image's data to its source image: a fixed label, the source
image's id and the digest of the boot image's data (Glance's ``os_hash_algo``, whose
``os_hash_value`` the worker checks against its own digest of what it uploaded).
"""

import base64
import binascii
import os

from cryptography import exceptions as crypto_exceptions
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives import serialization

from yolo_common import images

LABEL = b'yolo boot image signature v1'
# Digests a signature may name: Glance's os_hash_algo choices that are collision resistant.
ALGORITHMS = ('sha256', 'sha384', 'sha512', 'sha3_256', 'sha3_384', 'sha3_512', 'blake2b')


class SigningError(Exception):
    pass


def signed_message(source_image_id, algorithm, hexdigest):
    if algorithm not in ALGORITHMS:
        raise SigningError('digest %r is not one a signature may name' % algorithm)
    return b'\n'.join((LABEL, source_image_id.encode(), algorithm.encode(),
                       hexdigest.lower().encode()))


def file_digest(path, algorithm):
    """The hex digest of the file at ``path``."""
    if algorithm not in ALGORITHMS:
        raise SigningError('digest %r is not one a signature may name' % algorithm)
    with open(path, 'rb') as f:
        return images.file_digest(f.fileno(), algorithm)


def public_key_text(public_key):
    """A public key as the one line compute hosts are given: its 32 raw bytes in base64."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


class Signer:
    """The worker's private key."""

    def __init__(self, private_key):
        self._key = private_key

    @classmethod
    def from_file(cls, path):
        with open(path, 'rb') as f:
            if os.fstat(f.fileno()).st_mode & 0o077:
                raise SigningError('%s may be read by others than its owner: chmod 0600 it'
                                   % path)
            key = serialization.load_pem_private_key(f.read(), password=None)
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise SigningError('%s is not an Ed25519 private key' % path)
        return cls(key)

    @classmethod
    def generate(cls):
        return cls(ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def create(cls, path):
        """Writes a new key to ``path`` (readable by its owner only), unless there is one;
        returns the key in ``path``."""
        if not os.path.exists(path):
            pem = cls.generate()._key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption())
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, 'wb') as f:
                f.write(pem)
        return cls.from_file(path)

    @property
    def public_key(self):
        return public_key_text(self._key.public_key())

    def sign(self, source_image_id, algorithm, hexdigest):
        """The signature (base64) of a boot image whose data has ``hexdigest``."""
        message = signed_message(source_image_id, algorithm, hexdigest)
        return base64.b64encode(self._key.sign(message)).decode()

    def verifier(self):
        return Verifier([self.public_key])


class Verifier:
    """The public keys of the worker (several while a key is replaced)."""

    def __init__(self, public_keys):
        self._keys = []
        for text in public_keys:
            try:
                raw = base64.b64decode(text, validate=True)
                self._keys.append(ed25519.Ed25519PublicKey.from_public_bytes(raw))
            except (binascii.Error, ValueError) as e:
                raise SigningError('%r is not an Ed25519 public key in base64: %s'
                                   % (text, e)) from None
        if not self._keys:
            raise SigningError('no public key')

    def verify(self, signature, source_image_id, algorithm, hexdigest):
        """Whether ``signature`` (base64, as published) is one of the keys' over this data."""
        try:
            raw = base64.b64decode(signature or '', validate=True)
            message = signed_message(source_image_id, algorithm, hexdigest)
        except (binascii.Error, ValueError, SigningError):
            return False
        for key in self._keys:
            try:
                key.verify(raw, message)
                return True
            except crypto_exceptions.InvalidSignature:
                continue
        return False
