"""A separate process spending one daily budget (run by test_budget_race.py).

usage: budget_worker.py BASE_URL CAP_TOKENS -- say "ready", then on each "go" make one model call (task
utility, capped at CAP_TOKENS a day) and print "made" or "refused"; "stop" ends it.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")

import django

django.setup()

from chat.agent.llm import complete_sync  # noqa: E402
from core import config  # noqa: E402


def main() -> None:
    base_url, cap = sys.argv[1], int(sys.argv[2])
    budgets = [{"scope": "task", "target": "utility", "daily_tokens": cap}]
    with config.override(llm={"base_url": base_url, "model": "fake-model", "max_retries": 0, "budgets": budgets}):
        print("ready", flush=True)
        while sys.stdin.readline().strip() == "go":
            result = complete_sync(purpose="utility", messages=[{"role": "user", "content": "spend"}])
            print(
                "refused" if result.budget_exceeded else ("made" if result.ok else f"error {result.error}"), flush=True
            )


if __name__ == "__main__":
    main()
