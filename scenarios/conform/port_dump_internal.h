// scenarios/conform/port_dump_internal.h
//
// Internal to the port dump (scenarios/conform/port_dump.h): what the writer (port_dump.cc), the reader
// (port_dump_read.cc) and the HDF5 container (port_dump_h5.cc) share. Both containers hold a step
// as a StoredStep (its metadata and its tensors by key), so the reader validates both the same way.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "reference/model/hooks.h"
#include "reference/checkpoint/safetensors.h"
#include "reports/h5_reader.h"
#include "reports/h5_writer.h"

namespace dsv41::scenarios::conform::port_dump_detail {

// A component of the table, or a dsv41::Error naming the key.
const reference::model::ComponentInfo& table_row(const std::string& component, const std::string& key);

// One step as stored: a safetensors file's __metadata__ and tensors, or an HDF5 group's.
struct StoredStep {
  std::map<std::string, std::string> metadata;
  std::map<std::string, dsv41::reference::checkpoint::safetensors::Entry> tensors;
};

// The HDF5 container (docs/port-dump.md, "The HDF5 container"). The root attribute holding the
// manifest, a step group's attribute holding its metadata, a dataset's attribute naming its dtype.
inline constexpr const char* kH5ManifestAttr = "manifest";
inline constexpr const char* kH5MetadataAttr = "metadata";
inline constexpr const char* kH5DtypeAttr = "dtype";

// Writes one step as the group `group` ("step_000123"): one dataset per entry, the metadata as a
// JSON object in the group's "metadata" attribute.
void write_h5_step(reports::H5Writer& w, const std::string& group,
                   const std::vector<reference::checkpoint::safetensors::Entry>& entries,
                   const std::map<std::string, std::string>& metadata);
// The root attributes: format, version, and the manifest's JSON text.
void write_h5_manifest(reports::H5Writer& w, const std::string& manifest_json);

// The manifest's JSON text (the root attribute "manifest"); `where` names the dump in errors.
std::string read_h5_manifest(const reports::H5Reader& r, const std::string& where);
// One step group, every dataset checked against its dtype attribute; errors start with `where`
// ("port dump 'd.h5', group /step_000001") and name the dataset and the reason.
StoredStep read_h5_step(const reports::H5Reader& r, const std::string& group, const std::string& where);

}  // namespace dsv41::scenarios::conform::port_dump_detail
