"""Examples of services built on the ragrpc clients."""
