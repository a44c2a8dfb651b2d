// The GPU checks' pure cores with fake devices and pointers, and the runtime
// path on whatever this machine has (CI: no GPU).
#include "host/device_check.hpp"

#include <gtest/gtest.h>

#include <string>

#include "test_params.hpp"

namespace flash3::host {
namespace {

TEST(GpuArch, HopperPasses) {
  const CheckResult r = check_gpu_arch("NVIDIA H100 80GB HBM3", 9, 0);
  EXPECT_EQ(r.status, Status::kOk);
  EXPECT_EQ(r.message, "");
}

TEST(GpuArch, OtherArchitecturesNamed) {
  struct Case {
    const char* name;
    int major, minor;
    const char* message;
  } cases[] = {
      {"NVIDIA A100-SXM4-80GB", 8, 0,
       "flash3 needs an NVIDIA Hopper GPU (sm_90); found NVIDIA A100-SXM4-80GB (sm_80)"},
      {"NVIDIA GeForce RTX 4090", 8, 9,
       "flash3 needs an NVIDIA Hopper GPU (sm_90); found NVIDIA GeForce RTX 4090 (sm_89)"},
      {"NVIDIA B200", 10, 0, "flash3 needs an NVIDIA Hopper GPU (sm_90); found NVIDIA B200 (sm_100)"},
      {"Tesla T4", 7, 5, "flash3 needs an NVIDIA Hopper GPU (sm_90); found Tesla T4 (sm_75)"},
  };
  for (const Case& c : cases) {
    const CheckResult r = check_gpu_arch(c.name, c.major, c.minor);
    EXPECT_EQ(r.status, Status::kUnsupported);
    EXPECT_EQ(r.message, c.message);
  }
}

TEST(GpuArch, NoDeviceMessage) {
  const CheckResult r = no_device(cudaErrorNoDevice);
  EXPECT_EQ(r.status, Status::kUnsupported);
  EXPECT_EQ(r.message, std::string("flash3 needs an NVIDIA Hopper GPU (sm_90); found no CUDA device (") +
                           cudaGetErrorString(cudaErrorNoDevice) + ")");
}

cudaPointerAttributes attributes(cudaMemoryType type, int device) {
  cudaPointerAttributes a{};
  a.type = type;
  a.device = device;
  return a;
}

TEST(PointerKind, DeviceMemoryOfCurrentDevicePasses) {
  EXPECT_TRUE(check_pointer_attributes("q", attributes(cudaMemoryTypeDevice, 1), 1).ok());
  EXPECT_TRUE(check_pointer_attributes("q", attributes(cudaMemoryTypeManaged, 3), 0).ok());
}

TEST(PointerKind, HostMemoryRejected) {
  CheckResult r = check_pointer_attributes("q", attributes(cudaMemoryTypeUnregistered, -2), 0);
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_EQ(r.message, "q: expected a CUDA device pointer; got host memory");
  r = check_pointer_attributes("lse", attributes(cudaMemoryTypeHost, 0), 0);
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_EQ(r.message, "lse: expected a CUDA device pointer; got pinned host memory");
}

TEST(PointerKind, OtherDeviceRejected) {
  const CheckResult r = check_pointer_attributes("v", attributes(cudaMemoryTypeDevice, 1), 0);
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_EQ(r.message, "v: expected memory on the current CUDA device (0); got memory on device 1");
}

// On a machine without a GPU the runtime path must give the no-device message;
// with one, the verdict must match what the runtime reports about it.
TEST(CurrentDevice, MatchesThisMachine) {
  int expected_device = -1;
  const cudaError_t error = cudaGetDevice(&expected_device);
  int device = -1;
  const CheckResult r = check_current_device(&device);
  if (error != cudaSuccess) {
    EXPECT_EQ(r.status, Status::kUnsupported);
    EXPECT_EQ(r.message, no_device(error).message);
    return;
  }
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, expected_device), cudaSuccess);
  EXPECT_EQ(device, expected_device);
  EXPECT_EQ(r.message, check_gpu_arch(prop.name, prop.major, prop.minor).message);
  // Cached: the second answer is the same.
  EXPECT_EQ(check_current_device(&device).message, r.message);
}

}  // namespace
}  // namespace flash3::host
