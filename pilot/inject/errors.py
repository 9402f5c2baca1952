"""The one error of the injector: a pod the template cannot inject, with why in one line."""

from __future__ import annotations


class InjectError(Exception):
    """This pod cannot be injected; str() is one line naming the field or annotation."""
