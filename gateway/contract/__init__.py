"""Engine-neutral contract rules and values: validation, capability checks, stream encoding.

Pure: nothing here imports grpc, awaits an engine or holds state beyond one request; the
stateful objects that apply these rules (the request registry, the LoRA registry, the event
hubs) are ``openengine_gateway.core``'s, and ``openengine_gateway.server`` puts the results
on the wire.
"""
