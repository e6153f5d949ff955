"""Nova's test base classes, made to run under pytest."""

from nova import test


class NoDBTestCase(test.NoDBTestCase):
    """nova.test.NoDBTestCase that keeps the test method pytest's unittest runner attaches.

    Nova's base class deletes every public attribute after each test to free memory; pytest sets
    the test method as an attribute and deletes it itself afterwards, so it must survive.
    """

    def _clear_attrs(self):
        method = self.__dict__.pop(self._testMethodName, None)
        super()._clear_attrs()
        if method is not None:
            setattr(self, self._testMethodName, method)
