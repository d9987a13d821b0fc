"""Side-by-side benchmarks: Celery's beat, RedBeat and voltro_beat as real processes."""
