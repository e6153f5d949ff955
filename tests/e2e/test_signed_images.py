"""Signed images and Nova's signature verification (docs/first-boot.md): a boot that Nova would
verify takes Nova's path, where cursive checks the signature with the certificate from the
key manager, Barbican here (tools/aio/barbican.sh). The second compute host boots before the
download otherwise; these tests boot there with Nova's ``[glance] verify_glance_signatures``
off (the all-in-one's setting) and on (a file in its nova-compute-2.conf.d, restarted)."""

import base64
import datetime
import os
import subprocess

from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography import x509
from cryptography.x509.oid import NameOID
import pytest

from tests.e2e.conftest import admin
from tests.e2e.conftest import AIO
from tests.e2e.conftest import base_file_name
from tests.e2e.conftest import boot_until_ready
from tests.e2e.conftest import connection
from tests.e2e.conftest import create_server_on
from tests.e2e.conftest import delete_server
from tests.e2e.conftest import LogSince
from tests.e2e.conftest import upload_public
from yolo_nova.virt import first_boot
from yolo_testing.wait import wait as wait_until

VERIFY_CONF = '/etc/nova/nova-compute-2.conf.d/verify-signatures.conf'


@pytest.fixture(scope='module')
def signing_certificate(cloud):
    """An RSA key and its self-signed certificate, stored in Barbican (PEM, as Glance documents
    it) by the admin, who uploads and boots the images here: (private key, the certificate's
    secret id)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'yolo e2e image signing')])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=30))
                   .sign(key, hashes.SHA256()))
    secret = connection('aio-admin').key_manager.create_secret(
        name='yolo-e2e-signing-certificate', secret_type='certificate', algorithm='RSA',
        payload=base64.b64encode(certificate.public_bytes(serialization.Encoding.PEM)).decode(),
        payload_content_type='application/octet-stream', payload_content_encoding='base64')
    # The SDK's id is the secret's URL; images name the secret by its UUID.
    yield key, secret.id.rstrip('/').rsplit('/', 1)[-1]
    connection('aio-admin').key_manager.delete_secret(secret)


def upload_signed(name, image_file, signing_certificate):
    """``image_file`` as a public image signed as Glance documents it (RSA-PSS over the data,
    SHA-256); Glance verifies the signature as it stores the data."""
    key, certificate_id = signing_certificate
    with open(image_file, 'rb') as f:
        pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()),
                          salt_length=padding.PSS.MAX_LENGTH)
        signature = key.sign(f.read(), pss, hashes.SHA256())
    return upload_public(name, image_file,
                         'img_signature=%s' % base64.b64encode(signature).decode(),
                         'img_signature_hash_method=SHA-256',
                         'img_signature_key_type=RSA-PSS',
                         'img_signature_certificate_uuid=%s' % certificate_id)


def assert_took_novas_path(host_log, yolofs_log, image_id):
    assert 'Image %s boots once downloaded: Nova verifies its signature' % image_id in \
        host_log.read()
    assert '%s%s: serving a fill' % (base_file_name(image_id), first_boot.FILL_SUFFIX) \
        not in yolofs_log.read()


@pytest.mark.two_hosts
def test_a_signed_image_boots_on_novas_path(second_host, tiny_image, signing_certificate):
    image = upload_signed('e2e-signed', tiny_image, signing_certificate)
    compute, yolofs = LogSince('nova-compute-2.log'), LogSince('yolofs-compute-2.log')
    try:
        boot_until_ready(second_host, image['id'], 'e2e-signed')
        assert_took_novas_path(compute, yolofs, image['id'])
    finally:
        admin('image', 'delete', image['id'], parse=False, check=False)


@pytest.mark.two_hosts
def test_while_nova_verifies_signatures_every_image_takes_its_path(
        second_host, tiny_image, signing_certificate):
    """Nova verifies the signed image's signature with the certificate from Barbican and boots
    it; it refuses an unsigned image, and YOLO boots neither before the download."""
    signed = upload_signed('e2e-signed-verified', tiny_image, signing_certificate)
    unsigned = upload_public('e2e-unsigned-verified', tiny_image)
    try:
        with open(VERIFY_CONF, 'w') as conf:
            conf.write('[glance]\nverify_glance_signatures = true\n')
        subprocess.run([str(AIO), 'restart-compute2'], check=True)
        compute, yolofs = LogSince('nova-compute-2.log'), LogSince('yolofs-compute-2.log')
        boot_until_ready(second_host, signed['id'], 'e2e-signed-verified')
        assert 'Image signature verification succeeded for image %s' % signed['id'] in \
            compute.read()
        assert_took_novas_path(compute, yolofs, signed['id'])

        server = create_server_on(second_host, unsigned['id'], 'e2e-unsigned-verified')
        try:
            def failed():
                found = connection('aio-admin').compute.get_server(server['id'])
                return found if found.status == 'ERROR' else None
            wait_until('the unsigned image refused', 300, failed, 3.0)
        finally:
            delete_server('aio-admin', server['id'])
        assert 'Image signature verification failed for image: %s' % unsigned['id'] in \
            compute.read()
        assert_took_novas_path(compute, yolofs, unsigned['id'])
    finally:
        if os.path.exists(VERIFY_CONF):
            os.unlink(VERIFY_CONF)
        subprocess.run([str(AIO), 'restart-compute2'], check=True)
        for image in (signed, unsigned):
            admin('image', 'delete', image['id'], parse=False, check=False)
