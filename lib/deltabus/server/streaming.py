"""StreamingPull of `deltabus serve`.

PLACEHOLDER, to be replaced (issue 14, part B, written by another helper): until then every
StreamingPull call ends with UNIMPLEMENTED, so the official client's ``subscribe()`` stops
with an error instead of hanging. Unary Pull, Acknowledge and ModifyAckDeadline work.

The contract app.py calls: ``await handle_streaming_pull(state, request_iterator, context)``,
an async generator of ``google.pubsub_v1.types.StreamingPullResponse`` (``state`` is the
server's ``ServerState``, see ``state.py``).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

import grpc
import grpc.aio
from google.pubsub_v1 import types as pb

from .state import ServerState


async def handle_streaming_pull(
    state: ServerState, request_iterator: AsyncIterator[pb.StreamingPullRequest], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[pb.StreamingPullResponse]:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "StreamingPull is not implemented yet (placeholder); use Pull")
    # abort raises; the yield makes this an async generator, the shape the real one has
    yield pb.StreamingPullResponse()  # type: ignore[unreachable]
