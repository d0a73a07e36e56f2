#pragma once
// A step-phase timer for `kiln train --bench-steps`: `Phase ph("attention");` marks a scope.
// While a PhaseTimer is active (one per process, installed by the benchmark), each Phase records
// a pair of CUDA events on the current stream (device time, no host sync) or reads the wall clock
// on the CPU; PhaseTimer::collect sums them per name after the step. Without an active timer a
// Phase costs one pointer test.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.h"

namespace kiln::train {

class PhaseTimer {
 public:
  explicit PhaseTimer(Device device);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  static PhaseTimer* active();
  // Installs this timer (nullptr: none) for Phase scopes on every thread.
  static void set_active(PhaseTimer* timer);

  void begin(const char* name);  // opens a phase (phases do not nest: an open one is closed first)
  void end();
  const char* current() const;   // the open phase, or nullptr
  // Waits for the device, adds this step's phase times (ms) into `totals`, and clears the marks.
  void collect(std::map<std::string, double>& totals);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Phase {
 public:
  explicit Phase(const char* name);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  PhaseTimer* timer_;
  const char* prev_;
};

}  // namespace kiln::train
