"""The communicator: ``TorchComm`` (facade) over ``CommCore`` (state, engine, ops in flight),
the one dispatch path, ``TorchWork``, the lifecycle's state table, value types, argument
checks, the error hierarchy and the one map of engine/store/build failures to it."""
