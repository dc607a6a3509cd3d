"""Audio input: decoding, features and long-audio segmentation."""

SAMPLE_RATE = 16000  # Hz: the rate the model's features are computed at
