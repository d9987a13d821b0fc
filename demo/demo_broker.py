"""The demo's broker: kombu's filesystem transport, with each message whole before a worker
can see it.

kombu's own transport (5.x) opens a message's file under its final name, then writes it: a
worker that lists the folder in between takes the empty or partial file, cannot decode it and
exits (celery/kombu#1551), and the message is lost with it. On a busy machine a beat replica
is now and then paused right there. Here a message is written under the same name in a
``staging`` folder beside the messages (the worker's listing skips names without a queue),
then renamed into place in one step.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        staging = os.path.join(self.data_folder_out, "staging")
        try:
            os.makedirs(staging, exist_ok=True)
            with open(os.path.join(staging, name), "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(os.path.join(staging, name), os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
