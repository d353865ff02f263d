// CPU offload (fsdp.cpu_offload) behind one object: OffloadPolicy owns its buffers, events and host
// worker, and is what the schedule and the engine call where offloading changes what they do.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "fsdp_engine_impl.hpp"
#include "host_worker.hpp"

namespace shardlm {

// CPU offload's buffers, events and host worker; offload.cpp says which event or ticket guards which
// buffer.
struct OffloadState {
  std::unique_ptr<HostWorker> worker;
  Optimizer* optimizer = nullptr;
  Stream down = nullptr, up = nullptr;   // the backend's copy streams, device to host and back
  int threads = 1;                       // of the host's element-wise work
  DeviceArray slice[2];                  // device landing of the reduced slices (when the plan has them)
  DeviceArray landing[2];                // pinned host landing of the reduced slices, in the reduce dtype
  DeviceArray stage[2];                  // pinned staging of 16-bit uploads (worker only)
  std::unique_ptr<BackendEvent> reduced;               // comm: a unit's reduction is complete
  std::unique_ptr<BackendEvent> copied[2];             // down: the copy out of slice[b] into landing[b]
  std::unique_ptr<BackendEvent> staged[2];             // up: the upload out of stage[s] (worker only)
  std::unique_ptr<BackendEvent> params_free;           // the slices' last readers before uploads overwrite them
  std::unique_ptr<BackendEvent> device_sums_read;      // down: the copy of the device sums (offload_accumulate = device)
  std::vector<std::unique_ptr<BackendEvent>> uploaded;  // up, per unit: its compute slice is current
  std::vector<HostWorker::Ticket> upload_task;          // per unit: the task queueing its upload (0: none pending)
  HostWorker::Ticket landing_read[2] = {0, 0};          // the task that last summed landing[b]
  HostWorker::Ticket last_arrival = 0;                  // the task summing the latest reduced slice
  std::vector<double> sum_squares;  // per unit, of its gradient (valid with sums_valid), summed on the host
  // A gradient that goes down whole in fp32 in the step's last micro-step has its sum of squares taken
  // on the device (comm) instead: squares[u], with squares_on_device[u]; grad_norm copies them here.
  DeviceArray squares;
  std::vector<char> squares_on_device;
  std::vector<double> squares_host;
  // fsdp.offload_root_update = device (the plan has offload_stream_chunk): the root's update runs on the
  // compute stream, chunk by chunk, its master and moments copied up into stream_buf[c % 2] and back
  // down (down).
  double link_up_gbs = 0, link_down_gbs = 0;          // the host link as auto measured it (0: not measured)
  DeviceArray stream_buf[2];                           // a chunk's master, then each moment
  std::unique_ptr<BackendEvent> chunk_updated[2];      // compute: the chunk in stream_buf[s] is updated
  std::unique_ptr<BackendEvent> chunk_home[2];         // down: it is back in host memory (the buffer is free)
  std::unique_ptr<BackendEvent> state_home;            // down: the root's whole state is back
  std::unique_ptr<BackendEvent> grad_read;             // compute: the update has read the root's gradient
  const float* device_grad = nullptr;  // the root's step gradient, fp32 on the device, when it updates there
  // fsdp.offload_resident_gib: the root's first plan.offload_resident elements of master, then each moment,
  // stay on the device between updates there. Loaded: they are at least as new as the host's arrays (else
  // the host's are newer: at start, after a load or a host update); ahead: newer (the host's are stale
  // until resident_home copies them down).
  DeviceArray resident[3];
  std::unique_ptr<BackendEvent> resident_updated;  // compute: the device's last update of them
  bool resident_loaded = false, resident_ahead = false;
  bool state_away = false;             // the root's state last went through the device: wait state_home first
  std::vector<char> upload_on_device;  // per unit: its compute slice is being written on the device (uploaded[u])
  int next = 0;                     // the landing pair of the next reduction
  int next_stage = 0;               // worker only
  int micro = 0;                    // micro-steps reduced since zero_grad
  bool last_announced = false;      // the next micro-step is its step's last (FsdpEngine::last_micro_step)
  std::optional<StepHyper> early;  // and its update, known before its backward
  std::optional<FsdpEngine::StepUpdate> early_values;  // what optimizer_step must then be called with
  bool sums_valid = false;          // sum_squares are of the step's whole gradient
  bool updated_early = false;       // the step's updates are posted; optimizer_step comes next
  bool on_device = false;           // offload_accumulate = device: micro-steps summed on the device, not yet down
};

// The host link's speed up and down in GB/s: the best of four timed copies of kOffloadLinkProbeBytes
// each way between page-locked host memory and the device (fsdp.offload_root_update = auto).
std::pair<double, double> measure_host_link(Backend& device, Backend& host);

class FsdpEngine::Impl::OffloadPolicy {
 public:
  // The buffers, events and worker, for the units of m (and their optimizer); pin page-locks host memory
  // for the engine's lifetime. link: the host link as fsdp.offload_root_update = auto measured it (0: not).
  OffloadPolicy(Impl& m, Backend& host, Optimizer& optimizer, const std::function<void(void*, size_t)>& pin,
                double link_up_gbs, double link_down_gbs);

  // ---- the schedule's calls ----
  void micro_step_begins(bool backward);
  void micro_step_ends();
  // Unit u's reduction, its copy down and its sum into the host gradient (and, announced, its update).
  void reduce(size_t u, float* full);
  // Stream s waits for unit u's pending upload, if any.
  void await_upload(size_t u, Stream s);
  // The stream whose work last reads a full gradient buffer: the copies down may read it themselves.
  Stream grad_readers() const { return state_.down; }
  // The copies down follow the reductions on comm; the stream that then has them all.
  Stream follow_reductions();
  // The host worker idle and the copy streams done.
  void idle();
  void drain_worker() { state_.worker->drain(); }
  std::vector<Stream> copy_streams() const { return {state_.down, state_.up}; }

  // ---- the engine's calls ----
  void last_micro_step(const std::optional<StepUpdate>& update);
  void zero_grad();
  // This rank's sum of squares of its gradient slices (FsdpEngine::grad_norm, after finish_reductions).
  double sum_squares();
  // The step's update (FsdpEngine::optimizer_step, after finish_reductions).
  void optimizer_step(double lr, float grad_factor);
  // The compute slices from the host masters, through the worker's upload path.
  void refresh_compute_slices();
  // Unit u's gradient slice (FsdpEngine::grad_slice, after finish_reductions).
  void grad_slice(size_t u, std::vector<float>& out);
  // Before checkpoint_state hands out the host arrays (the engine idle), after a load into them.
  void checkpoint_state();
  void checkpoint_loaded();
  // Its device memory: the root's resident master, the staging of reductions and streamed chunks.
  size_t resident_master_bytes() const { return state_.resident[0].bytes(); }
  size_t resident_state_bytes() const { return state_.resident[1].bytes() + state_.resident[2].bytes(); }  // moments
  size_t staging_bytes() const;
  std::string description() const;
  // The engine ends: the worker finishes (or skips after an error) its tasks, then the copy streams.
  void stop_worker() { state_.worker.reset(); }
  void synchronize_copies();

 private:
  // offload_accumulate = device, no last micro-step announced: the device sums down into the host gradients.
  void flush_device_sums();
  // Posts unit u's update with h (or, without h, the upload of its master as it is) to the worker.
  void post_upload(size_t u, const StepHyper* h);
  // The root's update with h on the device, from state_.device_grad (fsdp.offload_root_update).
  void update_root_on_device(const StepHyper& h);
  // The resident part of the root's state back into the host's arrays when the device's is newer (on
  // `down`, then state_home and state_away), before anything on the host reads them.
  void resident_home();
  bool root_updates_on_device() const { return m.plan.offload_stream_chunk > 0; }
  // Uploads wait for every earlier reader of the compute slices.
  void uploads_follow_readers();

  Impl& m;
  OffloadState state_;
};

}  // namespace shardlm
