"""Date formats of the console in Simplified Chinese: the same numeric format as in English (one
format on every page, whatever the language)."""

from console.formats.en.formats import (  # noqa: F401
    DATE_FORMAT,
    DATETIME_FORMAT,
    SHORT_DATE_FORMAT,
    SHORT_DATETIME_FORMAT,
    TIME_FORMAT,
)
