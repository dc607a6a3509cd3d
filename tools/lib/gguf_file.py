"""The last step of every GGUF the reference probes write: a filled gguf.GGUFWriter out to its file."""


def finish(writer) -> None:
    """Header, key-values and tensors of `writer` (a gguf.GGUFWriter opened on a path) written; file
    closed."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
