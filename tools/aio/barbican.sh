# shellcheck shell=bash
# Barbican, the key manager the all-in-one cloud's Nova and Glance verify image signatures with
# (sourced by tools/aio/aio): barbican-api from PyPI under gunicorn as the other APIs, its
# database in MariaDB, secrets stored by its simple_crypto plugin (a key-encryption key in its
# configuration: a test deployment's choice, not a production one). Nova and Glance reach it
# through castellan ([key_manager] backend = barbican) with the user's token, as cursive fetches
# the certificate that an image's img_signature_certificate_uuid names.

BARBICAN_PORT=9311

setup_barbican() {
    progress "barbican"
    create_database barbican barbican
    install -d -o barbican -g barbican -m 0750 /var/lib/barbican
    config_file /etc/barbican/barbican.conf barbican <<EOF2
[DEFAULT]
host_href = http://$AIO_HOST:$BARBICAN_PORT
[database]
connection = $(db_url barbican barbican)
[secretstore]
enabled_secretstore_plugins = store_crypto
[crypto]
enabled_crypto_plugins = simple_crypto
[simple_crypto_plugin]
# 32 bytes, base64: the secret's 32 hex digits.
kek = $(printf %s "$(secret barbican-kek)" | base64)
$(authtoken_section barbican)
EOF2
    install -m 0644 "$AIO_VENV/etc/barbican/barbican-api-paste.ini" \
        /etc/barbican/barbican-api-paste.ini
    as_user barbican barbican-manage db upgrade >/dev/null
    start_wsgi barbican-api barbican "$BARBICAN_PORT" barbican.wsgi.api:application
}

# castellan's settings for Nova and Glance: the key manager is Barbican, found in the catalogue.
key_manager_section() {
    cat <<EOF2
[key_manager]
backend = barbican
[barbican]
auth_endpoint = http://$AIO_HOST:$KEYSTONE_PORT/v3
EOF2
}
