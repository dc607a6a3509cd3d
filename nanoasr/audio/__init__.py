"""Audio input: decoding, features and long-audio segmentation."""
