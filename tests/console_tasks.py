"""A django-q2 task for the console tests: logs one line inside a cluster worker process."""

import logging


def log_line(text: str) -> None:
    logging.getLogger("tests.console_tasks").warning(text)
