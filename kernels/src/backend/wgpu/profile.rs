//! Per-kernel timing of forward steps, for `engine-bench --profile`: every
//! dispatch of a profiled step gets its own compute pass, timed by the
//! device's timestamp queries where the adapter has them
//! (`Features::TIMESTAMP_QUERY`), else by the host around a submission of
//! that one dispatch (slower, and including each submission's overhead,
//! but available everywhere, lavapipe included). Times add up per kernel
//! name over the profiled steps. [`Recorder`] is where a step's recording
//! meets the profiler, so the backend records its dispatches one way
//! whether or not they are timed.

use tokenwire_core::EngineFaultKind;

use super::context::{Gpu, GpuError};

/// Where the times of a [`Profile`] come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileClock {
    /// The device's timestamp queries, around each dispatch's pass.
    Device,
    /// The host's clock around a submit-and-wait of each dispatch.
    Host,
}

/// One kernel's share of the profiled steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTime {
    /// The kernel and its role, e.g. `gate_up mat_vec x1 Bf16`.
    pub name: String,
    /// Dispatches over all profiled steps.
    pub calls: u64,
    /// Time over all profiled steps, nanoseconds.
    pub nanos: u64,
}

/// Kernel times over the steps run since profiling was switched on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// How the times were taken.
    pub clock: ProfileClock,
    /// Steps profiled.
    pub steps: u64,
    /// Per kernel, in order of first dispatch.
    pub kernels: Vec<KernelTime>,
}

impl Profile {
    fn add(&mut self, name: &str, nanos: u64) {
        match self.kernels.iter_mut().find(|k| k.name == name) {
            Some(k) => {
                k.calls += 1;
                k.nanos += nanos;
            }
            None => self.kernels.push(KernelTime {
                name: name.to_string(),
                calls: 1,
                nanos,
            }),
        }
    }

    /// Total time of every kernel, nanoseconds.
    pub fn total_nanos(&self) -> u64 {
        self.kernels.iter().map(|k| k.nanos).sum()
    }
}

/// Where the host's wall time of forward steps went, phase by phase. A
/// step that returns tokens or rows is waited for, so the next one is
/// planned only after it came back, and the device idles while the host
/// plans that one and records its first submission (a step that returns
/// nothing is not waited for: its device time shows in the next step's
/// wait). Always gathered (four clock reads a step);
/// [`super::WgpuBackend::take_host_times`] takes them. Only unprofiled
/// steps' figures mean this: profiling adds its own submissions and waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTimes {
    /// Steps timed.
    pub steps: u64,
    /// Submissions those steps took.
    pub submissions: u64,
    /// Planning the step and writing its plan and parameters into the
    /// queue, nanoseconds over all steps.
    pub plan_nanos: u64,
    /// Recording its passes, and submitting all but the last of them
    /// ([`super::WgpuOptions::first_submit`]).
    pub record_nanos: u64,
    /// Finishing the last encoder and submitting it.
    pub submit_nanos: u64,
    /// Waiting for the device and reading back what the step returns.
    pub wait_nanos: u64,
}

/// Queries per set (two per dispatch): wgpu's cap on one query set.
const SET_QUERIES: u32 = ::wgpu::QUERY_SET_MAX_QUERIES;

/// The query sets and buffers of device timing, and the running profile.
#[derive(Debug)]
pub(crate) struct Profiler {
    pub(crate) profile: Profile,
    /// Switched off for now (the gathered times are kept).
    pub(crate) paused: bool,
    sets: Vec<::wgpu::QuerySet>,
    resolve: Option<::wgpu::Buffer>,
    readback: Option<::wgpu::Buffer>,
    period_ns: f64,
}

impl Profiler {
    /// A profiler on `want`'s clock, or the host's where the device has no
    /// timestamp queries.
    pub(crate) fn new(gpu: &Gpu, want: ProfileClock) -> Profiler {
        let clock = match want {
            ProfileClock::Device if gpu.timestamps => ProfileClock::Device,
            _ => ProfileClock::Host,
        };
        Profiler {
            profile: Profile {
                clock,
                steps: 0,
                kernels: Vec::new(),
            },
            paused: false,
            sets: Vec::new(),
            resolve: None,
            readback: None,
            period_ns: gpu.queue.get_timestamp_period() as f64,
        }
    }

    pub(crate) fn clock(&self) -> ProfileClock {
        self.profile.clock
    }

    /// Makes room for timestamps around `ops` dispatches.
    pub(crate) fn ensure(&mut self, gpu: &Gpu, ops: usize) {
        let sets = (2 * ops as u32).div_ceil(SET_QUERIES).max(1) as usize;
        if self.sets.len() >= sets {
            return;
        }
        while self.sets.len() < sets {
            self.sets
                .push(gpu.device.create_query_set(&::wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: ::wgpu::QueryType::Timestamp,
                    count: SET_QUERIES,
                }));
        }
        let bytes = sets as u64 * SET_QUERIES as u64 * ::wgpu::QUERY_SIZE as u64;
        use ::wgpu::BufferUsages as U;
        self.resolve = Some(gpu.buffer("profile.resolve", bytes, U::QUERY_RESOLVE | U::COPY_SRC));
        self.readback = Some(gpu.buffer("profile.readback", bytes, U::MAP_READ | U::COPY_DST));
    }

    /// The timestamp writes around dispatch `i` of a step (device clock).
    pub(crate) fn writes(&self, i: usize) -> Option<::wgpu::ComputePassTimestampWrites<'_>> {
        let q = 2 * i as u32;
        let set = self.sets.get((q / SET_QUERIES) as usize)?;
        let at = q % SET_QUERIES;
        Some(::wgpu::ComputePassTimestampWrites {
            query_set: set,
            beginning_of_pass_write_index: Some(at),
            end_of_pass_write_index: Some(at + 1),
        })
    }

    /// Records the copy of `ops` dispatches' timestamps to the readback buffer.
    pub(crate) fn resolve(&self, enc: &mut ::wgpu::CommandEncoder, ops: usize) {
        let (Some(resolve), Some(readback)) = (&self.resolve, &self.readback) else {
            return;
        };
        let mut left = 2 * ops as u32;
        for (s, set) in self.sets.iter().enumerate() {
            if left == 0 {
                break;
            }
            let n = left.min(SET_QUERIES);
            let off = s as u64 * SET_QUERIES as u64 * ::wgpu::QUERY_SIZE as u64;
            enc.resolve_query_set(set, 0..n, resolve, off);
            left -= n;
        }
        let bytes = 2 * ops as u64 * ::wgpu::QUERY_SIZE as u64;
        enc.copy_buffer_to_buffer(resolve, 0, readback, 0, bytes);
    }

    /// After the step's submission: adds the device times of dispatches
    /// named `names` (in dispatch order).
    pub(crate) fn collect_device(&mut self, gpu: &Gpu, names: &[String]) -> Result<(), GpuError> {
        let Some(readback) = &self.readback else {
            return Ok(());
        };
        let bytes = gpu.read_mapped(readback, 16 * names.len() as u64)?;
        for (name, pair) in names.iter().zip(bytes.chunks_exact(16)) {
            let t0 = u64::from_le_bytes(pair[..8].try_into().unwrap_or_default());
            let t1 = u64::from_le_bytes(pair[8..].try_into().unwrap_or_default());
            let ns = (t1.saturating_sub(t0) as f64 * self.period_ns) as u64;
            self.profile.add(name, ns);
        }
        self.profile.steps += 1;
        Ok(())
    }

    /// Adds host-timed dispatches.
    pub(crate) fn collect_host(&mut self, times: &[(String, u64)]) {
        for (name, ns) in times {
            self.profile.add(name, *ns);
        }
        self.profile.steps += 1;
    }
}

/// When a step's recording goes to the device before the step is whole:
/// after the first `first` dispatches, then after each run of twice as
/// many as the run before. The device then starts on the step's first
/// layers while the host records the rest, and each run it works on is
/// longer than the next one the host records (a dispatch records in a few
/// microseconds and runs in about ten on a GPU), so after the first run
/// the device should not wait on the host. Every submission costs its own
/// fixed time, hence few and growing. llama.cpp's Vulkan backend submits
/// its graphs in pieces for the same reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SubmitSchedule {
    /// Dispatches left before the next early submission; `None`: none.
    left: Option<usize>,
    /// The length of the run being recorded.
    run: usize,
}

impl SubmitSchedule {
    /// Submissions after `first` dispatches, then doubling runs; `first`
    /// 0: one submission for the whole step.
    pub(crate) fn new(first: usize) -> SubmitSchedule {
        SubmitSchedule {
            left: (first > 0).then_some(first),
            run: first,
        }
    }

    /// How many of the next `n` dispatches to record before asking
    /// [`SubmitSchedule::due`]; counts them as recorded.
    fn take(&mut self, n: usize) -> usize {
        match &mut self.left {
            Some(left) => {
                let k = n.min(*left);
                *left -= k;
                k
            }
            None => n,
        }
    }

    /// Whether what is recorded should be submitted now; if so, the next
    /// run (twice as long) starts.
    fn due(&mut self) -> bool {
        if self.left != Some(0) {
            return false;
        }
        self.run = self.run.saturating_mul(2);
        self.left = Some(self.run);
        true
    }
}

/// Records a step's compute passes and submits them: without a profiler,
/// in submissions that grow (see [`SubmitSchedule`]), so the device starts
/// on the step while the host still records it; with one, each dispatch in
/// its own timestamped pass of one submission (device clock) or in its own
/// timed submission (host clock).
pub(crate) struct Recorder<'a> {
    gpu: &'a Gpu,
    enc: ::wgpu::CommandEncoder,
    label: &'a str,
    profiler: Option<&'a mut Profiler>,
    schedule: SubmitSchedule,
    /// Submissions made before [`Recorder::finish`].
    early: u64,
    /// Names of the dispatches timed so far, in order (device clock).
    names: Vec<String>,
    /// Names and times of the dispatches timed so far (host clock).
    host_times: Vec<(String, u64)>,
}

impl<'a> Recorder<'a> {
    /// A recorder for a step of `dispatches` dispatches, timed by `profiler`
    /// (an active one) where given, else submitted early on `schedule`.
    pub(crate) fn new(
        gpu: &'a Gpu,
        label: &'a str,
        mut profiler: Option<&'a mut Profiler>,
        dispatches: usize,
        schedule: SubmitSchedule,
    ) -> Recorder<'a> {
        if let Some(p) = profiler.as_deref_mut() {
            if p.clock() == ProfileClock::Device {
                p.ensure(gpu, dispatches);
            }
        }
        let enc = gpu
            .device
            .create_command_encoder(&::wgpu::CommandEncoderDescriptor { label: Some(label) });
        Recorder {
            gpu,
            enc,
            label,
            profiler,
            schedule,
            early: 0,
            names: Vec::new(),
            host_times: Vec::new(),
        }
    }

    /// The step's encoder, for what goes between passes (copies).
    pub(crate) fn encoder(&mut self) -> &mut ::wgpu::CommandEncoder {
        &mut self.enc
    }

    /// Records `items` in a compute pass labelled `label`, each set in the
    /// pass by `encode`, and named in the profile by `name`.
    pub(crate) fn pass<T>(
        &mut self,
        label: &str,
        items: &[T],
        name: impl Fn(&T) -> String,
        encode: impl Fn(&mut ::wgpu::ComputePass<'_>, &[T]) -> Result<(), EngineFaultKind>,
    ) -> Result<(), EngineFaultKind> {
        let one =
            |enc: &mut ::wgpu::CommandEncoder,
             items: &[T],
             timestamp_writes: Option<::wgpu::ComputePassTimestampWrites<'_>>| {
                let mut pass = enc.begin_compute_pass(&::wgpu::ComputePassDescriptor {
                    label: Some(label),
                    timestamp_writes,
                });
                encode(&mut pass, items)
            };
        match self.profiler.as_deref().map(Profiler::clock) {
            None => {
                // A failure to encode after an early submission leaves the
                // step's first layers run (their K/V written to the cache);
                // running the step again writes the same values.
                let mut items = items;
                loop {
                    let (now, rest) = items.split_at(self.schedule.take(items.len()));
                    if !now.is_empty() {
                        one(&mut self.enc, now, None)?;
                    }
                    if self.schedule.due() {
                        self.submit_so_far();
                    }
                    if rest.is_empty() {
                        return Ok(());
                    }
                    items = rest;
                }
            }
            Some(ProfileClock::Device) => {
                let p = self.profiler.as_deref();
                for item in items {
                    let writes = p.and_then(|p| p.writes(self.names.len()));
                    one(&mut self.enc, std::slice::from_ref(item), writes)?;
                    self.names.push(name(item));
                }
                Ok(())
            }
            Some(ProfileClock::Host) => {
                let g = self.gpu;
                // Everything recorded so far runs first, untimed.
                let before = std::mem::replace(
                    &mut self.enc,
                    g.device.create_command_encoder(&Default::default()),
                );
                g.queue.submit([before.finish()]);
                g.wait().map_err(GpuError::into_fault)?;
                for item in items {
                    let mut e = g.device.create_command_encoder(&Default::default());
                    one(&mut e, std::slice::from_ref(item), None)?;
                    let t = std::time::Instant::now();
                    g.queue.submit([e.finish()]);
                    g.wait().map_err(GpuError::into_fault)?;
                    self.host_times
                        .push((name(item), t.elapsed().as_nanos() as u64));
                }
                Ok(())
            }
        }
    }

    /// Submits what is recorded so far and goes on in a new encoder.
    fn submit_so_far(&mut self) {
        let fresh = self
            .gpu
            .device
            .create_command_encoder(&::wgpu::CommandEncoderDescriptor {
                label: Some(self.label),
            });
        let done = std::mem::replace(&mut self.enc, fresh);
        self.gpu.queue.submit([done.finish()]);
        self.early += 1;
    }

    /// Submits the rest of the step and, with a profiler, adds its
    /// dispatches' times; returns how many submissions the step took
    /// (without a profiler: the early ones and this).
    pub(crate) fn finish(mut self) -> Result<u64, EngineFaultKind> {
        if let Some(p) = self.profiler.as_deref() {
            p.resolve(&mut self.enc, self.names.len());
        }
        self.gpu.queue.submit([self.enc.finish()]);
        let submissions = self.early + 1;
        let Some(p) = self.profiler else {
            return Ok(submissions);
        };
        match p.clock() {
            ProfileClock::Device => p
                .collect_device(self.gpu, &self.names)
                .map_err(GpuError::into_fault),
            ProfileClock::Host => {
                p.collect_host(&self.host_times);
                Ok(())
            }
        }
        .map(|()| submissions)
    }
}

#[cfg(test)]
mod tests {
    use super::SubmitSchedule;

    /// Where `schedule` submits early in a step of passes of these many
    /// dispatches, as counts of dispatches recorded before each early
    /// submission: the way [`super::Recorder::pass`] consults it.
    fn cuts(first: usize, passes: &[usize]) -> Vec<usize> {
        let mut s = SubmitSchedule::new(first);
        let (mut done, mut cuts) = (0, Vec::new());
        for &n in passes {
            let mut left = n;
            loop {
                let k = s.take(left);
                done += k;
                left -= k;
                if s.due() {
                    cuts.push(done);
                }
                if left == 0 {
                    break;
                }
            }
        }
        cuts
    }

    #[test]
    fn runs_double_after_the_first_wherever_passes_end() {
        for passes in [&[30][..], &[5, 10, 2, 13], &[1; 30], &[3, 6, 12, 9]] {
            assert_eq!(cuts(3, passes), [3, 9, 21], "passes {passes:?}");
        }
        // A step that ends on a cut submits there, and its copies go in
        // one more submission.
        assert_eq!(cuts(1, &[7]), [1, 3, 7]);
    }

    #[test]
    fn zero_submits_once() {
        assert!(cuts(0, &[135]).is_empty());
        assert!(cuts(0, &[5, 0, 2000]).is_empty());
    }
}
