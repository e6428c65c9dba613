"""Open Inference Protocol v2: ``codec`` (tensors in JSON and binary) and ``routes``."""
