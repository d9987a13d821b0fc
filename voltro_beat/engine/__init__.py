"""The firing engine (:mod:`voltro_beat.engine.firing`) and the steps it takes: the timeline
of schedules, the recorder and its overlap guard, the runs won ahead until their instant
(:mod:`voltro_beat.engine.ready`), recovery, and upkeep."""

from voltro_beat.engine.firing import CLOSE_WAIT, RETRY_DELAY, Engine

__all__ = ["CLOSE_WAIT", "RETRY_DELAY", "Engine"]
