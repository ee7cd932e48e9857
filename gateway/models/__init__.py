"""Gateway-side model management: over-the-air updates of the ONNX models the gateway runs."""
