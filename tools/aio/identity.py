"""Keystone's content for the all-in-one cloud: service users, services and endpoints, a demo
project with a non-admin user, and the clouds.yaml that reaches them. Idempotent.

Run by tools/aio/aio with the venv's Python after ``keystone-manage bootstrap``; passwords come
from the files in $AIO_SECRETS (made by the script).
"""

import os

import openstack
import yaml

SECRETS = os.environ['AIO_SECRETS']
HOST = os.environ['AIO_HOST']
REGION = os.environ['AIO_REGION']
KEYSTONE = 'http://%s:5000/v3' % HOST

# Service users of the project "service": (user, roles). The worker reads every project's
# images and publishes boot images: it needs admin in Glance.
SERVICE_USERS = {
    'glance': ('admin', 'service'),
    'placement': ('admin', 'service'),
    'nova': ('admin', 'service'),
    'neutron': ('admin', 'service'),
    'barbican': ('admin', 'service'),
    'cinder': ('admin', 'service'),
    'yolo': ('admin', 'service'),
}
# (service type, name, URL)
SERVICES = [
    ('image', 'glance', 'http://%s:9292' % HOST),
    ('placement', 'placement', 'http://%s:8778' % HOST),
    ('compute', 'nova', 'http://%s:8774/v2.1' % HOST),
    ('network', 'neutron', 'http://%s:9696' % HOST),
    ('key-manager', 'barbican', 'http://%s:9311' % HOST),
    ('block-storage', 'cinder', 'http://%s:8776/v3' % HOST),
]
# Non-admin users, each in a project of its own: (user, project).
TENANTS = [('demo', 'demo'), ('alt', 'alt')]


def secret(name):
    with open(os.path.join(SECRETS, name)) as f:
        return f.read().strip()


def ensure_user(conn, name, password, project):
    user = conn.identity.find_user(name, domain_id='default')
    if user is None:
        return conn.identity.create_user(name=name, password=password, domain_id='default',
                                         default_project_id=project.id)
    return conn.identity.update_user(user, password=password)


def ensure_roles(conn, user, project, roles):
    for role_name in roles:
        role = conn.identity.find_role(role_name) or conn.identity.create_role(name=role_name)
        conn.identity.assign_project_role_to_user(project, user, role)


def ensure_project(conn, name):
    return (conn.identity.find_project(name, domain_id='default')
            or conn.identity.create_project(name=name, domain_id='default'))


def ensure_endpoints(conn, service_type, name, url):
    service = next((s for s in conn.identity.services() if s.type == service_type), None)
    if service is None:
        service = conn.identity.create_service(type=service_type, name=name)
    existing = {e.interface: e for e in conn.identity.endpoints(service_id=service.id)}
    for interface in ('public', 'internal'):
        if interface in existing:
            if existing[interface].url != url:
                conn.identity.update_endpoint(existing[interface], url=url)
        else:
            conn.identity.create_endpoint(service_id=service.id, interface=interface, url=url,
                                          region_id=REGION)


def cloud(username, password, project):
    return {
        'auth': {
            'auth_url': KEYSTONE, 'username': username, 'password': password,
            'project_name': project, 'user_domain_name': 'Default',
            'project_domain_name': 'Default',
        },
        'region_name': REGION,
        'identity_api_version': 3,
    }


def main():
    admin_password = secret('admin')
    conn = openstack.connect(**cloud('admin', admin_password, 'admin')['auth'],
                             region_name=REGION)
    service_project = ensure_project(conn, 'service')
    for name, roles in SERVICE_USERS.items():
        user = ensure_user(conn, name, secret('keystone-' + name), service_project)
        ensure_roles(conn, user, service_project, roles)
    for service_type, name, url in SERVICES:
        ensure_endpoints(conn, service_type, name, url)
    clouds = {'aio-admin': cloud('admin', admin_password, 'admin')}
    for name, project_name in TENANTS:
        project = ensure_project(conn, project_name)
        user = ensure_user(conn, name, secret(name), project)
        ensure_roles(conn, user, project, ('member', 'reader'))
        clouds['aio-' + name] = cloud(name, secret(name), project_name)
    path = os.path.join(os.path.dirname(SECRETS), 'clouds.yaml')
    with open(os.open(path + '.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:
        yaml.safe_dump({'clouds': clouds}, f, default_flow_style=False)
    os.replace(path + '.tmp', path)


if __name__ == '__main__':
    main()
