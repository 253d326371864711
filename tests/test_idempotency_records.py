"""coordinator/idempotency.py records a refused request's error in a format-neutral form and raises it again on
replay; bodies in any other form (answers, errors in a protocol's words from older versions) are handed back."""

from __future__ import annotations

from coordinator.errors import BadRequest, CoordinatorError, LocationTaken, NoSuchView
from coordinator.idempotency import error_record_body, recorded_error


class FormatsOwnError(NoSuchView):
    """A subclass defined outside coordinator.errors: replayed as the nearest class there."""


def test_an_error_comes_back_as_its_class_with_its_message_and_status():
    for error in (LocationTaken("s3://b/t"), NoSuchView("View does not exist: db.v"), FormatsOwnError("gone")):
        again = recorded_error(error_record_body(error))
        assert isinstance(again, NoSuchView if isinstance(error, NoSuchView) else type(error))
        assert (again.message, again.status) == (error.message, error.status)
    changed = BadRequest("Method Not Allowed")
    changed.status = 405
    assert recorded_error(error_record_body(changed)).status == 405


def test_other_bodies_are_not_errors_to_raise():
    assert recorded_error(b'{"error":{"message":"m","type":"CommitFailedException","code":409}}') is None
    assert recorded_error(b'{"namespace":["a"],"properties":{}}') is None
    unknown = recorded_error(b'{"recorded-error":{"class":"Gone","message":"m","status":410}}')
    assert type(unknown) is CoordinatorError and unknown.status == 410
