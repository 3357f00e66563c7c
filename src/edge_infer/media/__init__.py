"""Media preprocessing for the multimodal thinkers (torch-free): images, audio and video into encoder features."""
