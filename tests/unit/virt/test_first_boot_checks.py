"""What a first boot before the download checks before it trusts Glance's answers or takes
the image at all: the ranges sent, the checksum Nova would verify, signatures Nova verifies."""

from unittest import mock

import pytest
import requests

from tests.unit import nova_base
from yolo_common import yolofs
from yolo_nova.virt import first_boot


def answer(status, content_range=None):
    response = requests.Response()
    response.status_code = status
    if content_range is not None:
        response.headers['Content-Range'] = content_range
    return response


@pytest.mark.parametrize('response, start, end', [
    (answer(206, 'bytes 100-199/1000'), 100, 199),
    (answer(206, 'bytes 100-999/1000'), 100, None),
    (answer(206, 'bytes 100-999/*'), 100, None),
])
def test_the_range_asked_for_is_taken(response, start, end):
    first_boot.check_content_range(response, start, end)


@pytest.mark.parametrize('response, start, end, error', [
    # A store that cannot serve ranges: the whole image, or Glance's 400.
    (answer(200), 100, 199, 'HTTP 200'),
    (answer(400), 100, None, 'HTTP 400'),
    # Other bytes than those asked for.
    (answer(206, 'bytes 0-99/1000'), 100, 199, 'bytes 0-99 for a request of 100-199'),
    (answer(206, 'bytes 100-150/1000'), 100, 199, 'bytes 100-150'),
    (answer(206, 'bytes 0-999/1000'), 100, None, 'bytes 0-999'),
    (answer(206), 100, 199, "Content-Range ''"),
    (answer(206, 'items 100-199/1000'), 100, 199, 'bytes 100-199 for a request'),
])
def test_any_other_answer_fails_the_fill(response, start, end, error):
    with pytest.raises(first_boot.FillFailed, match=error):
        first_boot.check_content_range(response, start, end)


def test_the_checksum_is_glances_multihash_or_the_legacy_md5():
    assert first_boot.image_checksum({
        'os_hash_algo': 'sha512', 'os_hash_value': 'abc', 'checksum': 'def'}) == ('sha512', 'abc')
    # An image uploaded before Glance's multihash: its MD5, as glanceclient verifies it.
    assert first_boot.image_checksum({'os_hash_algo': None, 'os_hash_value': None,
                                      'checksum': 'def'}) == ('md5', 'def')
    assert first_boot.image_checksum({'checksum': None}) is None


class TestSignedImages(nova_base.NoDBTestCase):
    """Signed images, and every image while Nova verifies signatures, take Nova's path."""

    SIGNED = {'properties': {
        'img_signature': 'c2lnbmF0dXJl', 'img_signature_hash_method': 'SHA-256',
        'img_signature_key_type': 'RSA-PSS', 'img_signature_certificate_uuid': 'uuid'}}

    def test_a_signed_image_takes_novas_path_with_either_setting(self):
        for verify in (False, True):
            self.flags(verify_glance_signatures=verify, group='glance')
            self.assertTrue(first_boot.signature_checked_by_nova(self.SIGNED))

    def test_an_unsigned_image_takes_novas_path_while_nova_verifies_signatures(self):
        unsigned = {'properties': {'hw_qemu_guest_agent': 'yes'}}
        self.flags(verify_glance_signatures=True, group='glance')
        self.assertTrue(first_boot.signature_checked_by_nova(unsigned))
        self.flags(verify_glance_signatures=False, group='glance')
        self.assertFalse(first_boot.signature_checked_by_nova(unsigned))
        self.assertFalse(first_boot.signature_checked_by_nova({}))

    def test_a_server_that_asks_for_trusted_certificates_takes_novas_path(self):
        unsigned = {'properties': {}}
        self.assertTrue(first_boot.signature_checked_by_nova(unsigned, ['cert-id']))
        self.flags(enable_certificate_validation=True, group='glance')
        self.assertFalse(first_boot.signature_checked_by_nova(unsigned))
        self.flags(default_trusted_certificate_ids=['cert-id'], group='glance')
        self.assertTrue(first_boot.signature_checked_by_nova(unsigned))
        first_boots = first_boot.FirstBoots(mock.Mock(base_dir='/nonexistent/_base'), mock.Mock(),
                                            '/nonexistent/locks')
        self.assertIsNone(first_boots.begin(mock.sentinel.context, 'an-image',
                                            '/nonexistent/_base/abc', 1 << 30,
                                            trusted_certs=['cert-id']))
        first_boots.boot_images.image_api.get.assert_not_called()

    def test_without_the_workers_keys_no_image_boots_before_its_download(self):
        backing = mock.Mock(base_dir='/nonexistent/_base')
        backing.status.return_value = yolofs.Status.from_answer({'boot_images': []})
        boot_images = mock.Mock(verifier=None)
        first_boots = first_boot.FirstBoots(backing, boot_images, '/nonexistent/locks')
        self.assertIsNone(first_boots.begin(mock.sentinel.context, 'an-image',
                                            '/nonexistent/_base/abc', 1 << 30))
        boot_images.image_api.get.assert_not_called()
        boot_images.download.assert_not_called()

    def test_a_signed_image_boots_once_downloaded_by_nova(self):
        backing = mock.Mock(base_dir='/nonexistent/_base')
        backing.status.return_value = yolofs.Status.from_answer({'boot_images': []})
        boot_images = mock.Mock()
        boot_images.image_api.get.return_value = dict(
            self.SIGNED, id='an-image', disk_format='raw', size=1 << 20, os_hash_algo='sha512',
            os_hash_value='abc')
        first_boots = first_boot.FirstBoots(backing, boot_images, '/nonexistent/locks')
        self.flags(verify_glance_signatures=True, group='glance')
        self.assertIsNone(first_boots.begin(mock.sentinel.context, 'an-image',
                                            '/nonexistent/_base/abc', 1 << 30))
        boot_images.trusted_boot_image.assert_not_called()
        boot_images.download.assert_not_called()
