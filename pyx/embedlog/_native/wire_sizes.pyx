# cython: language_level=3
"""The sizes the wire codecs share (wire_sizes.pxd): the 20-byte master key, BookKeeper's
5 MiB frame limit and embedlog's 56-byte request header, one definition for the Cython
modules that cimport them and the Python modules that import them."""
