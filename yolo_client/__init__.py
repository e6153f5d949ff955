"""``openstack yolo``: an openstackclient plugin that shows YOLO's images and servers."""
