"""export: ONNX export of attention modules and numerical validation in onnxruntime."""
