"""The camera service: one camera source, ONNX inference on its frames, over-the-air model updates,
and the events they produce (docs/camera.md).

    runner.py     ``CameraRunner``: starts and stops the parts below as one unit, source switches, pins
    source.py     ``CameraSource``: OpenCV capture on a thread (file, MJPEG/RTSP URL or device)
    change.py     ``ChangeDetector``: which frames changed enough to be worth inferring
    inference.py  ``InferenceEngine``: onnxruntime sessions, micro-batching, verified hot swap
    ota.py        ``ModelUpdater``: new versions from the registry (notices + polling), pins
    events.py     ``CameraEventRecorder``: each inference result becomes one log record + MQTT event

Nothing here imports OpenCV, numpy or onnxruntime at module level of ``runner``: a gateway
without a camera never loads them.
"""
