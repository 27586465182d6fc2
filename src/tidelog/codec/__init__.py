"""Pure byte formats: no files, no sockets. Bytes in, objects out, and back."""
