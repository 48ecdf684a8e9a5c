"""A separate process racing for due scheduled messages (run by test_claim_race.py).

usage: claim_worker.py deliver BATCH   -- deliver rounds until nothing has been due for a while
       claim_worker.py claim-and-die   -- claim everything due, then crash before finishing
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")

import django

django.setup()

from django.utils import timezone  # noqa: E402

from maibot import config  # noqa: E402
from scheduling import dispatcher  # noqa: E402


def main() -> None:
    mode = sys.argv[1]
    if mode == "claim-and-die":
        _, claimed = dispatcher.claim_due(timezone.now(), limit=10_000, lease_seconds=1.0)
        print(f"claimed {len(claimed)}", flush=True)
        os._exit(17)  # no cleanup, no commit of a finish: a crash between claim and completion
    batch = int(sys.argv[2])
    sent = 0
    idle_since = time.monotonic()
    with config.override(scheduling={"batch_size": batch}):
        while time.monotonic() - idle_since < 1.5:
            report = dispatcher.deliver_due()
            sent += report.sent
            if report.claimed:
                idle_since = time.monotonic()
    print(f"sent {sent}", flush=True)


if __name__ == "__main__":
    main()
