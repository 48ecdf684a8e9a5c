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

from core import config  # noqa: E402
from scheduling import dispatcher  # noqa: E402

LEASE_SECONDS = 60.0


def main() -> None:
    mode = sys.argv[1]
    if mode == "claim-and-die":
        _, claimed = dispatcher.claim_due(timezone.now(), limit=10_000, lease_seconds=LEASE_SECONDS)
        print(f"claimed {len(claimed)}", flush=True)
        os._exit(17)  # no cleanup, no commit of a finish: a crash between claim and completion
    batch = int(sys.argv[2])
    sent = 0
    # Lockstep rounds: the test says "go" to every worker at once, each tries one claim-and-deliver
    # round and reports; "stop" ends it. Every worker claims in every round while work is left, so the
    # race is real whatever the machine's load.
    print("ready", flush=True)
    with config.override(scheduling={"batch_size": batch}):
        while sys.stdin.readline().strip() == "go":
            report = dispatcher.deliver_due()
            sent += report.sent
            print(f"round {report.claimed} {report.sent}", flush=True)
    print(f"sent {sent}", flush=True)


if __name__ == "__main__":
    main()
