// Precompiled header for project translation units: the heavy LibTorch headers that
// nearly every .cpp includes. Never include this from a public header.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
