"""The agent's clock is the checks' clock: today's date, and a warm-up that ended just now."""

import datetime
import time


def test_today_is_today():
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert open("/app/today.txt").read().strip() == today


def test_the_warmup_finished_within_the_last_hour():
    ready = float(open("/app/ready.txt").read())
    assert time.time() - 3600 < ready <= time.time() + 1
