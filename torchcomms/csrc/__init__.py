"""C++ sources of torchcomms and their build (``python -m torchcomms.csrc.build``)."""
