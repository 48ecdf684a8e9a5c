"""Date formats of the console in English: one numeric format everywhere, with the zone's offset
(core.text.SHOWN_FORMAT is the same format for times the console formats itself)."""

DATETIME_FORMAT = "Y-m-d H:i:s O"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
