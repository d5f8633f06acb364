"""Stage ③ of the data path: event time — watermarks (and later windows and triggers)."""

from streamrag.eventtime.watermarks import BoundedOutOfOrderness

__all__ = ["BoundedOutOfOrderness"]
