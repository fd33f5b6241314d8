"""C++ kernels of the CPU engine, compiled once with torch's extension builder into ``.cache/kernels``."""
