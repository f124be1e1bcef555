"""Send one request through Dynamo's own request plane to a registered worker and print what comes back.

Run by ``.venv-dynamo/bin/python`` (Dynamo's runtime is not installed in the gateway's venv), with
``DYN_FILE_KV`` naming the discovery directory the sidecar registered in:

    python tests/dynamo/drive.py '{"model": "mock-model", "token_ids": [104, 105], ...}' [--stop-after N]

The request is Dynamo's ``PreprocessedRequest`` (what its frontend sends a worker after tokenizing);
each response (an ``LLMEngineOutput``) is printed as one JSON line, then ``{"end": N}`` with the
count. ``--stop-after N`` calls ``Context.stop_generating()`` after the Nth response: Dynamo's own
cancellation, which the sidecar turns into a cancelled stream and ``Control/Abort``. It follows
``Client.generate`` and ``Context`` of ``dynamo/_core.pyi`` in ai-dynamo-runtime 1.6.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from dynamo.runtime import Context, DistributedRuntime

ENDPOINT = "dynamo.backend.generate"
"""The sidecar's default namespace, component and endpoint."""


async def drive(request: dict[str, object], stop_after: int | None, wait_s: float) -> None:
    """Wait for the worker, send ``request``, print each response as it arrives."""
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    try:
        client = await runtime.endpoint(ENDPOINT).client()
        await asyncio.wait_for(client.wait_for_instances(), wait_s)
        context = Context()
        count = 0
        async for response in await client.generate(request, context=context):
            count += 1
            print(json.dumps(response.data()), flush=True)
            if count == stop_after:
                context.stop_generating()
        print(json.dumps({"end": count}), flush=True)
    finally:
        runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", help="a PreprocessedRequest as JSON")
    parser.add_argument("--stop-after", type=int, help="stop generating after this many responses")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for a registered worker")
    args = parser.parse_args()
    asyncio.run(drive(json.loads(args.request), args.stop_after, args.wait_s))


if __name__ == "__main__":
    main()
