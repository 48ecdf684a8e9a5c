"""A separate process racing for due scheduled messages (run by test_claim_race.py).

usage: claim_worker.py deliver BATCH   -- say "ready", wait for "go" on stdin, then deliver rounds until
                                          no row is pending or being sent
       claim_worker.py claim-and-die   -- claim everything due with a 60 s lease, then crash before finishing
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")

import django

django.setup()

from django.utils import timezone  # noqa: E402

from maibot import config  # noqa: E402
from scheduling import dispatcher  # noqa: E402
from scheduling.models import ScheduledMessage, ScheduledStatus  # noqa: E402

LEASE_SECONDS = 60.0


def main() -> None:
    mode = sys.argv[1]
    if mode == "claim-and-die":
        _, claimed = dispatcher.claim_due(timezone.now(), limit=10_000, lease_seconds=LEASE_SECONDS)
        print(f"claimed {len(claimed)}", flush=True)
        os._exit(17)  # no cleanup, no commit of a finish: a crash between claim and completion
    batch = int(sys.argv[2])
    sent = 0
    # Start together: the test says "go" once every worker is ready, so they really race.
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    unfinished = ScheduledMessage.objects.filter(status__in=[ScheduledStatus.PENDING, ScheduledStatus.SENDING])
    with config.override(scheduling={"batch_size": batch}):
        # Every row is due before the workers start: once none is pending or being sent, all are sent.
        while True:
            report = dispatcher.deliver_due()
            sent += report.sent
            if not report.claimed and not unfinished.exists():
                break
    print(f"sent {sent}", flush=True)


if __name__ == "__main__":
    main()
