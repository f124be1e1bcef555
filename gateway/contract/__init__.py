"""Engine-neutral contract rules: validation, stream encoding, request ids, event hubs.

Nothing here imports grpc or awaits an engine; ``openengine_gateway.core`` applies these
rules to the running engines and ``openengine_gateway.server`` puts them on the wire.
"""
