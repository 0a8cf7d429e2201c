"""Using a trained run: open its saved config and checkpoint (`saved_run`), score it again (`evaluate`), export the
model for serving (`export`), and classify a folder of images (`predict`); each is `python -m swinexp.serve.<tool>`."""
