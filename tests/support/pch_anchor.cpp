// Gives the shared precompiled header (Catch2 + torch/torch.h) a target to be built in.
