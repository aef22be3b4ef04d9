// All kernel families of src/kernels (a convenience for files that use several).
#pragma once

#include "kernels/decode_kernels.h"
#include "kernels/kmeans_kernels.h"
#include "kernels/layer_kernels.h"
#include "kernels/select_kernels.h"
