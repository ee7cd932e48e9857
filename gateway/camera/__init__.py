"""The camera service: one camera source, ONNX inference on its frames, over-the-air model updates,
and the events they produce (docs/camera.md).

    runner.py     ``CameraRunner``: starts and stops the parts below as one unit, source switches, pins
    source.py     ``CameraSource``: OpenCV capture on a thread (file, MJPEG/RTSP URL or device)
    change.py     ``ChangeDetector``: which frames changed enough to be worth inferring
    inference.py  ``InferenceEngine``: onnxruntime sessions, micro-batching, verified hot swap
    ota.py        ``ModelUpdater``: what to run (pin, cloudd's assignment, factory model), downloads, swaps
    model_store.py ``LocalModels``: the factory artifact, downloaded versions, pin.json, running.json
    figures.py    ``ModelWindow``: the running version's live figures and its shadow's agreement
    model_view.py ``scene@<version> (<stage>)`` in the services' details; the heartbeat's ``models``
    events.py     ``CameraEventRecorder``: each inference result becomes one log record + MQTT event

Nothing here imports OpenCV, numpy or onnxruntime at module level of ``runner``: a gateway
without a camera never loads them.
"""
