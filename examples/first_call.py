"""A first completion from a running gateway: ``.venv/bin/python examples/first_call.py [HOST:PORT]``.

The README's first screen runs this against ``make serve`` (127.0.0.1:50051 unless an address is given).
"""

from __future__ import annotations

import asyncio
import sys

from openengine_gateway.client import OpenEngineClient, text_request


async def main(address: str) -> None:
    async with await OpenEngineClient.connect(address) as client:
        print(client.engine_info.engine_name, list(client.engine_info.supported_models))
        completion = await client.generate(text_request("the quick brown fox", max_tokens=16, temperature=0.0))
        print(repr(completion.outputs[0].text), completion.usage.completion_tokens, "tokens")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"))
