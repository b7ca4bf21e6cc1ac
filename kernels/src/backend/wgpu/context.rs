//! The wgpu device: adapter choice, limits, error capture and buffer helpers.

use std::sync::{Arc, Mutex};

use tokenwire_core::EngineFaultKind;

use super::coop::{CoopConfig, CoopTile, CoopTiles};
use super::WgpuOptions;

/// An error the device reported outside any error scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GpuError {
    /// An allocation failed.
    OutOfMemory(String),
    /// The device is gone (driver reset, removed GPU).
    Lost(String),
    /// Validation or internal error: a bug on our side or in the driver.
    Other(String),
}

impl GpuError {
    pub(crate) fn into_fault(self) -> EngineFaultKind {
        match self {
            GpuError::OutOfMemory(_) => EngineFaultKind::OutOfMemory,
            GpuError::Lost(_) => EngineFaultKind::DeviceLost,
            GpuError::Other(m) => EngineFaultKind::Internal(format!("wgpu: {m}")),
        }
    }

    pub(crate) fn message(&self) -> String {
        match self {
            GpuError::OutOfMemory(m) => format!("out of device memory: {m}"),
            GpuError::Lost(m) => format!("device lost: {m}"),
            GpuError::Other(m) => m.clone(),
        }
    }
}

/// Device, queue and what we learned about the adapter.
pub(crate) struct Gpu {
    pub(crate) device: ::wgpu::Device,
    pub(crate) queue: ::wgpu::Queue,
    pub(crate) info: ::wgpu::AdapterInfo,
    /// Largest storage binding we use, bytes (the device limit or a smaller override).
    pub(crate) max_binding: u64,
    /// Alignment of dynamic uniform offsets.
    pub(crate) uniform_align: u64,
    /// `shader-f16` enabled: f16 weights are read as `array<f16>`.
    pub(crate) f16_native: bool,
    /// Timestamp queries enabled (for profiling; asked for where offered).
    pub(crate) timestamps: bool,
    /// Subgroup operations enabled (asked for where offered, unless the
    /// options turn them off): mat-vec reductions use shuffles.
    pub(crate) subgroups: bool,
    /// Cooperative matrices enabled, in these configurations (asked for
    /// with [`WgpuOptions::cooperative_matrix`], where the adapter offers a
    /// usable one), one per tile.
    pub(crate) coop: CoopTiles,
    /// `@coherent` storage buffers enabled (every Vulkan adapter offers
    /// it): decode attention's and the split coop products' partials are
    /// read coherently by the workgroup that merges or sums them in the
    /// same dispatch, which needs it.
    pub(crate) coherent: bool,
    /// Shaders keep the loop counters wgpu adds to every loop
    /// ([`WgpuOptions::loop_bounding`]).
    loop_bounding: bool,
    errors: Arc<Mutex<Vec<GpuError>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("max_binding", &self.max_binding)
            .field("f16_native", &self.f16_native)
            .field("timestamps", &self.timestamps)
            .field("subgroups", &self.subgroups)
            .field("coherent", &self.coherent)
            .field("coop", &self.coop)
            .finish_non_exhaustive()
    }
}

/// The instance, with the backends `WGPU_BACKEND` names (all when unset).
fn instance() -> ::wgpu::Instance {
    ::wgpu::Instance::new(::wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter wgpu finds with the backends `WGPU_BACKEND` allows.
pub fn adapters() -> Vec<::wgpu::AdapterInfo> {
    let inst = instance();
    let backends = ::wgpu::Backends::from_env().unwrap_or(::wgpu::Backends::all());
    pollster::block_on(inst.enumerate_adapters(backends))
        .iter()
        .map(|a| a.get_info())
        .collect()
}

fn describe(info: &::wgpu::AdapterInfo) -> String {
    format!(
        "\"{}\" ({:?}, {:?})",
        info.name, info.backend, info.device_type
    )
}

/// The token that lets a device enable wgpu's experimental features, here
/// only `EXPERIMENTAL_COOPERATIVE_MATRIX`. wgpu makes it `unsafe` because
/// its experimental features may still have bugs with undefined behaviour
/// behind a safe API; the one this crate uses is confined to
/// coop_mat_mul.wgsl, whose cooperative loads and stores stay inside its
/// workgroup arrays by construction (the tile shapes come from
/// [`CoopConfig`]) and which the parity tests check on every shape they
/// draw. One of the backend's two unsafe calls, each kept to its function.
#[allow(unsafe_code)]
fn experimental_features() -> ::wgpu::ExperimentalFeatures {
    // SAFETY: see above; only the cooperative-matrix feature is requested
    // with this token, and only its own kernel uses it.
    unsafe { ::wgpu::ExperimentalFeatures::enabled() }
}

/// A shader module without the 64-bit counter wgpu adds to every loop so
/// that no loop can run forever; bounds checks and every other runtime
/// check stay. The counter keeps drivers from unrolling constant-count
/// loops, so per-invocation arrays indexed by their counters may land in
/// slow local memory (`engine-bench --loop-bounding` puts it back).
/// wgpu makes this `unsafe` because a loop that never ends would then be
/// undefined behaviour: every loop in `shaders/` ends by construction (a
/// counter moving by a positive constant, a power of two, or a parameter
/// the host sets to at least 1, towards a bound; sample.wgsl's searches
/// advance a byte index each turn, and their scans step down through 16
/// groups and 16 buckets). The second and
/// last unsafe call of the backend.
#[allow(unsafe_code)]
fn unbounded_loops_module(
    device: &::wgpu::Device,
    desc: ::wgpu::ShaderModuleDescriptor<'_>,
) -> ::wgpu::ShaderModule {
    let checks = ::wgpu::ShaderRuntimeChecks {
        force_loop_bounding: false,
        ..::wgpu::ShaderRuntimeChecks::checked()
    };
    // SAFETY: no loop of these shaders runs forever (see above); bounds
    // checks stay on.
    unsafe { device.create_shader_module_trusted(desc, checks) }
}

/// Discrete before integrated before virtual before software.
fn rank(t: ::wgpu::DeviceType) -> u8 {
    match t {
        ::wgpu::DeviceType::DiscreteGpu => 0,
        ::wgpu::DeviceType::IntegratedGpu => 1,
        ::wgpu::DeviceType::VirtualGpu => 2,
        ::wgpu::DeviceType::Cpu => 3,
        ::wgpu::DeviceType::Other => 4,
    }
}

/// [`WgpuOptions::coop_split_workgroups`]'s default on GPUs: a few
/// workgroups per multiprocessor of a large GPU (132 on an H100).
const GPU_SPLIT_WORKGROUPS: u32 = 512;

impl Gpu {
    /// Picks an adapter (by name substring, or the best kind) and opens a
    /// device with every limit the adapter offers.
    pub(crate) fn new(opts: &WgpuOptions) -> Result<Gpu, String> {
        let inst = instance();
        let backends = ::wgpu::Backends::from_env().unwrap_or(::wgpu::Backends::all());
        let mut found = pollster::block_on(inst.enumerate_adapters(backends));
        let env = std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "unset".into());
        if found.is_empty() {
            return Err(format!(
                "no GPU adapter found (backends {backends:?}, WGPU_BACKEND={env}); \
                 without a GPU on Linux, Mesa's software Vulkan driver works: \
                 apt-get install mesa-vulkan-drivers"
            ));
        }
        found.sort_by_key(|a| rank(a.get_info().device_type));
        let adapter = match &opts.adapter {
            None => found.swap_remove(0),
            Some(want) => {
                let w = want.to_lowercase();
                match found
                    .iter()
                    .position(|a| a.get_info().name.to_lowercase().contains(&w))
                {
                    Some(i) => found.swap_remove(i),
                    None => {
                        let names: Vec<String> =
                            found.iter().map(|a| describe(&a.get_info())).collect();
                        return Err(format!(
                            "no GPU adapter name contains \"{want}\" (WGPU_BACKEND={env}); available: {}",
                            names.join(", ")
                        ));
                    }
                }
            }
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let f16_native =
            opts.shader_f16 && adapter.features().contains(::wgpu::Features::SHADER_F16);
        let timestamps = adapter
            .features()
            .contains(::wgpu::Features::TIMESTAMP_QUERY);
        let subgroups = opts.subgroups && adapter.features().contains(::wgpu::Features::SUBGROUP);
        let mut features = ::wgpu::Features::empty();
        if subgroups {
            features |= ::wgpu::Features::SUBGROUP;
        }
        if f16_native {
            features |= ::wgpu::Features::SHADER_F16;
        }
        if timestamps {
            features |= ::wgpu::Features::TIMESTAMP_QUERY;
        }
        let coherent = adapter
            .features()
            .contains(::wgpu::Features::MEMORY_DECORATION_COHERENT);
        if coherent {
            features |= ::wgpu::Features::MEMORY_DECORATION_COHERENT;
        }
        let coop_offered = opts.cooperative_matrix
            && adapter
                .features()
                .contains(::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let pick = |tile| {
            if !coop_offered {
                return None;
            }
            CoopConfig::pick(
                &adapter.cooperative_matrix_properties(),
                info.subgroup_min_size,
                info.subgroup_max_size,
                f16_native,
                limits.max_compute_workgroup_storage_size,
                opts.coop_k_slab,
                tile,
            )
        };
        let square = pick(CoopTile::Square4);
        let coop = CoopTiles {
            square,
            wide: square.and_then(|_| pick(CoopTile::Wide8)),
            tall: square
                .filter(|_| opts.coop_tall)
                .and_then(|_| pick(CoopTile::Tall4)),
        };
        let mut experimental = ::wgpu::ExperimentalFeatures::disabled();
        if coop.square.is_some() {
            features |= ::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
            experimental = experimental_features();
        }
        let desc = ::wgpu::DeviceDescriptor {
            label: Some("tokenwire"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: experimental,
            memory_hints: ::wgpu::MemoryHints::Performance,
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| format!("adapter {} refused a device: {e}", describe(&info)))?;
        let errors: Arc<Mutex<Vec<GpuError>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: ::wgpu::Error| {
            let item = match e {
                ::wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory(e.to_string()),
                other => GpuError::Other(other.to_string()),
            };
            if let Ok(mut v) = sink.lock() {
                v.push(item);
            }
        }));
        let sink = errors.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut v) = sink.lock() {
                v.push(GpuError::Lost(format!("{reason:?}: {msg}")));
            }
        });
        let mut max_binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if let Some(cap) = opts.max_binding {
            max_binding = max_binding.min(cap);
        }
        // Whole 16-byte words: buffers are padded to them (vec4 reads), and a
        // chunk cut to fit the binding must still fit once padded.
        let max_binding = max_binding / 16 * 16;
        let cpu_adapter = info.device_type == ::wgpu::DeviceType::Cpu;
        let split = |c: CoopConfig| CoopConfig {
            split_to: opts.coop_split_workgroups.unwrap_or(if cpu_adapter {
                0
            } else {
                GPU_SPLIT_WORKGROUPS
            }),
            split_max_bytes: max_binding,
            // The folded sum reads other workgroups' partials: only with
            // `@coherent` storage.
            fold: opts.coop_fold_splits && coherent,
            ..c
        };
        let coop = coop.map(split);
        Ok(Gpu {
            device,
            queue,
            info,
            max_binding,
            uniform_align: u64::from(limits.min_uniform_buffer_offset_alignment).max(16),
            f16_native,
            timestamps,
            subgroups,
            coop,
            coherent,
            loop_bounding: opts.loop_bounding,
            errors,
        })
    }

    /// Compiles a WGSL module: with wgpu's full runtime checks, or, without
    /// [`WgpuOptions::loop_bounding`], with every check but the loop bound.
    pub(crate) fn shader_module(&self, label: &str, source: String) -> ::wgpu::ShaderModule {
        let desc = ::wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: ::wgpu::ShaderSource::Wgsl(source.into()),
        };
        if self.loop_bounding {
            return self.device.create_shader_module(desc);
        }
        unbounded_loops_module(&self.device, desc)
    }

    /// The first error the device reported since the last call, if any;
    /// later ones are dropped (they usually follow from the first).
    pub(crate) fn take_error(&self) -> Option<GpuError> {
        let mut v = self.errors.lock().ok()?;
        let first = v.first().cloned();
        v.clear();
        first
    }

    /// A zeroed storage buffer of at least `bytes` (rounded up to 16).
    pub(crate) fn buffer(
        &self,
        label: &str,
        bytes: u64,
        usage: ::wgpu::BufferUsages,
    ) -> ::wgpu::Buffer {
        self.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).div_ceil(16) * 16,
            usage,
            mapped_at_creation: false,
        })
    }

    /// A bind group of `bufs`, whole, at bindings 0, 1, ... of `layout`
    /// (every storage binding shape of the kernels).
    pub(crate) fn storage_bind_group(
        &self,
        layout: &::wgpu::BindGroupLayout,
        label: &str,
        bufs: &[&::wgpu::Buffer],
    ) -> ::wgpu::BindGroup {
        let at: Vec<(u32, &::wgpu::Buffer)> = (0u32..).zip(bufs.iter().copied()).collect();
        self.storage_bind_group_at(layout, label, &at)
    }

    /// A bind group of whole buffers at the given bindings of `layout` (a
    /// layout whose bindings are not 0, 1, ...).
    pub(crate) fn storage_bind_group_at(
        &self,
        layout: &::wgpu::BindGroupLayout,
        label: &str,
        bufs: &[(u32, &::wgpu::Buffer)],
    ) -> ::wgpu::BindGroup {
        let entries: Vec<::wgpu::BindGroupEntry<'_>> = bufs
            .iter()
            .map(|&(binding, b)| ::wgpu::BindGroupEntry {
                binding,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&::wgpu::BindGroupDescriptor {
            label: Some(label),
            layout,
            entries: &entries,
        })
    }

    /// A storage buffer holding `bytes`, padded with zeros to whole 16-byte
    /// words (kernels read x and packed weights as vec4s).
    pub(crate) fn buffer_init(&self, label: &str, bytes: &[u8]) -> ::wgpu::Buffer {
        use ::wgpu::util::DeviceExt;
        let usage = ::wgpu::BufferUsages::STORAGE
            | ::wgpu::BufferUsages::COPY_SRC
            | ::wgpu::BufferUsages::COPY_DST;
        if bytes.len().is_multiple_of(16) && !bytes.is_empty() {
            return self
                .device
                .create_buffer_init(&::wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytes,
                    usage,
                });
        }
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().max(16).div_ceil(16) * 16, 0);
        self.device
            .create_buffer_init(&::wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &padded,
                usage,
            })
    }

    /// Waits until everything submitted has run.
    pub(crate) fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        Ok(())
    }

    /// Waits for the queue, then copies `bytes` bytes of a `MAP_READ` buffer out.
    pub(crate) fn read_mapped(
        &self,
        staging: &::wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let size = bytes.max(4).div_ceil(4) * 4;
        let slice = staging.slice(0..size);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(::wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        let mapped = rx.recv();
        if let Some(e) = self.take_error() {
            // Leave the buffer unmapped, or the next copy into it fails too.
            if matches!(mapped, Ok(Ok(()))) {
                staging.unmap();
            }
            return Err(e);
        }
        match mapped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(GpuError::Other(format!("map_async: {e}"))),
            Err(_) => return Err(GpuError::Other("map_async callback dropped".into())),
        }
        let out = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Other(format!("get_mapped_range: {e}")))?;
            view[..bytes as usize].to_vec()
        };
        staging.unmap();
        Ok(out)
    }
}

/// Workgroup counts for `n` workgroups: x up to 65535, the rest in y. Kernels
/// compute the flat index as `wid.x + wid.y * num_workgroups.x` and skip the
/// overhang.
pub(crate) fn grid(n: u32) -> [u32; 2] {
    const MAX: u32 = 65535;
    if n <= MAX {
        [n.max(1), 1]
    } else {
        [MAX, n.div_ceil(MAX)]
    }
}
