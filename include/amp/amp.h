// Umbrella header: everything public in amp.
#pragma once

#include <amp/version.h>
#include <amp/export.h>
#include <amp/info.h>
