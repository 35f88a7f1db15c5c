"""The protocol as code: every event, order and update that crosses between a run's processes as
a frozen dataclass (events, orders, updates), the one codec that writes and reads them, and
docs/events.md written from them (reference)."""
