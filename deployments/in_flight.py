"""`max_choices_in_flight` counted from the moment a request is checked, not from the moment its
choices start streaming.

A request is checked before it awaits the encode workers and its engine client (which tokenizes
its strings before it registers the choices with the router), so checking the router's streams
alone would let many requests that arrive together all pass and then overshoot the limit. Each
request reserves its choices when it is checked; the reservation counts against the limit until
the choices are registered (then the router counts them), or until the request ends any other way:
an error, a 4xx, a client that leaves (its handler is cancelled). A reservation's choices and its
registered streams may count twice for a moment, never zero times.
"""

from __future__ import annotations

from types import TracebackType

from deployments.limits import RequestLimits, check_in_flight


class ChoiceReservations:
    """The choices of an ingress replica's requests that were admitted and are not streaming yet."""

    def __init__(self) -> None:
        self.reserved = 0

    def reserve(self, limits: RequestLimits, streaming: int, choices: int) -> Reservation:
        """Reserve ``choices`` beside ``streaming`` (the router's) and those reserved already; 503 past the limit.
        No await between the check and the count: concurrent requests cannot both pass on the same room."""
        check_in_flight(limits, streaming + self.reserved, choices)
        self.reserved += choices
        return Reservation(self, choices)


class Reservation:
    """One request's reserved choices; released once (again: nothing), on leaving a ``with`` whatever happened."""

    def __init__(self, owner: ChoiceReservations, choices: int) -> None:
        self._owner = owner
        self.choices = choices

    def release(self) -> None:
        self._owner.reserved -= self.choices
        self.choices = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.release()
